"""The group admin HTTP API as an OpenAPI 3.1 document, generated from :mod:`qim.admin.models`.

Served at ``GET /v1/openapi.json`` (no secret: it describes, it grants nothing) and committed as
``docs/admin-openapi.json``; ``python -m qim.admin.openapi --check`` fails when the committed
copy is stale. The schemas come from ``msgspec.json.schema_components`` over the very structs
the handlers decode with, so the document and the server cannot disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from qim.admin.models import (
    AddMembersBody,
    AdminErrorBody,
    CreateGroupBody,
    GroupChangeReply,
    PromoteRoomBody,
    PromoteRoomReply,
    SetRoleBody,
    TransferOwnerBody,
)
from qim.admin.wire import (
    ADMIN_ACTOR_HEADER,
    ADMIN_AS_MEMBER_HEADER,
    ADMIN_SECRET_HEADER,
    DEFAULT_GROUP_ADMIN_URL,
)

__all__ = ["COMMITTED", "document", "render"]

COMMITTED: Final = Path(__file__).resolve().parents[2] / "docs" / "admin-openapi.json"
_REF: Final = "#/components/schemas/{name}"
_ERRORS: Final = {
    "400": "bad input: the detail names the field",
    "401": "missing or wrong X-Qim-Admin-Secret",
    "403": "PERMISSION_DENIED: no such group, group exists, or the role table refuses",
    "409": "another refusal of the ConversationWriter (the A.6 code in `error`)",
    "413": "PAYLOAD_TOO_LARGE",
    "429": "RATE_LIMITED (`retry_after_ms`)",
    "503": "Kafka unreachable or REGION_FAILOVER: retry",
    "504": "no answer in time: retrying is safe (the request is idempotent per group version)",
}


def _ref(model: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=model.__name__)}


def _json(model: type) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(model)}}}


def _param(
    name: str, where: str, description: str, *, required: bool = True, flag: bool = False
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "boolean"} if flag else {"type": "string", "minLength": 1}
    return {
        "name": name,
        "in": where,
        "required": required,
        "description": description,
        "schema": schema,
    }


_GROUP: Final = _param("group_id", "path", "the group's id (`g:...`)")
_USER: Final = _param("user_id", "path", "the member's user id")
_TENANT_Q: Final = _param("tenant_id", "query", "the tenant")
_ACTOR_Q: Final = _param("actor", "query", "who made the change", required=False)
_BAN_Q: Final = _param("ban", "query", "ban as well as remove", required=False, flag=True)
_AS_MEMBER_Q: Final = _param(
    "as_member", "query", "act on behalf of the member `actor`", required=False, flag=True
)


def _operation(
    summary: str,
    *,
    body: type | None = None,
    reply: type = GroupChangeReply,
    params: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": list(params),
        "responses": {
            "200": {"description": "done", **_json(reply)},
            **{code: {"description": t, **_json(AdminErrorBody)} for code, t in _ERRORS.items()},
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    return op


def document() -> dict[str, Any]:
    """The OpenAPI document (deterministic: the same bytes on every run)."""
    models = (
        CreateGroupBody, AddMembersBody, SetRoleBody, TransferOwnerBody, PromoteRoomBody,
        GroupChangeReply, PromoteRoomReply, AdminErrorBody,
    )  # fmt: skip
    _, components = msgspec.json.schema_components(models, ref_template=_REF)
    headers = {
        "secret": {"type": "apiKey", "in": "header", "name": ADMIN_SECRET_HEADER},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "qim group admin API",
            "version": "1",
            "description": (
                "The trusted plane's group and room administration (spec 20.2.2, 14.4). "
                f"Every route but this document needs `{ADMIN_SECRET_HEADER}`. Optional "
                f"headers: `{ADMIN_ACTOR_HEADER}` (default actor), `{ADMIN_AS_MEMBER_HEADER}` "
                "(default as_member)."
            ),
        },
        "servers": [{"url": DEFAULT_GROUP_ADMIN_URL}],
        "security": [{"secret": []}],
        "paths": {
            "/v1/groups": {"post": _operation("create a group", body=CreateGroupBody)},
            "/v1/groups/{group_id}": {
                "delete": _operation(
                    "dissolve the group", params=(_GROUP, _TENANT_Q, _ACTOR_Q, _AS_MEMBER_Q)
                )
            },
            "/v1/groups/{group_id}/members": {
                "post": _operation("add members", body=AddMembersBody, params=(_GROUP,)),
                "get": _operation(
                    "the group's membership version and member count",
                    params=(_GROUP, _TENANT_Q, _ACTOR_Q),
                ),
            },
            "/v1/groups/{group_id}/members/{user_id}": {
                "delete": _operation(
                    "remove (or ban) a member",
                    params=(_GROUP, _USER, _TENANT_Q, _BAN_Q, _ACTOR_Q, _AS_MEMBER_Q),
                )
            },
            "/v1/groups/{group_id}/members/{user_id}/role": {
                "put": _operation("grant or revoke ADMIN", body=SetRoleBody, params=(_GROUP, _USER))
            },
            "/v1/groups/{group_id}/owner": {
                "post": _operation("transfer ownership", body=TransferOwnerBody, params=(_GROUP,))
            },
            "/v1/rooms/{room_id}/promote": {
                "post": _operation(
                    "promote a chatroom's online members to a group",
                    body=PromoteRoomBody,
                    reply=PromoteRoomReply,
                    params=(_param("room_id", "path", "the chatroom"),),
                )
            },
            "/v1/openapi.json": {
                "get": {
                    "summary": "this document",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1"}},
                }
            },
        },
        "components": {"schemas": components, "securitySchemes": headers},
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    """``--check``: exit 1 when docs/admin-openapi.json differs; else (re)write it."""
    text = render()
    if "--check" in argv:
        current = COMMITTED.read_text() if COMMITTED.exists() else ""
        if current != text:
            print(f"{COMMITTED} is stale: run python -m qim.admin.openapi", file=sys.stderr)
            return 1
        return 0
    COMMITTED.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
