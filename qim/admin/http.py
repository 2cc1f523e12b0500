"""The group admin HTTP endpoint (operators, the account system): GroupAdmin over aiohttp.

Bound to 127.0.0.1 by default and protected by a shared secret in the ``X-Qim-Admin-Secret``
header (constant-time compare), like the AuthService's admin endpoint (``qim.auth.admin``);
put it behind service-to-service mTLS before exposing it beyond loopback (§20.1).

``POST   /v1/groups``                               ``{tenant_id, group_id, owner_id,
                                                   member_ids?, e2ee?}`` create (owner = OWNER)
``POST   /v1/groups/{group_id}/members``            ``{tenant_id, member_ids, actor?}`` GroupAdd
``DELETE /v1/groups/{group_id}/members/{user_id}``  ``?tenant_id=..&ban=1&actor=..`` GroupRemove
``GET    /v1/groups/{group_id}/members``            ``?tenant_id=..`` show: version and count
``PUT    /v1/groups/{group_id}/members/{user_id}/role`` ``{tenant_id, role, actor?}`` grant /
                                                   revoke ADMIN (role ADMIN | MEMBER | GUEST)
``POST   /v1/groups/{group_id}/owner``              ``{tenant_id, new_owner_id, actor?}`` transfer
``DELETE /v1/groups/{group_id}``                    ``?tenant_id=..&actor=..`` dissolve
``GET    /v1/openapi.json``                         this API as OpenAPI 3.1 (no secret needed;
                                                   generated from :mod:`qim.admin.models`)

``actor`` (who did it, recorded in the CONTROL message) defaults to the ``X-Qim-Admin-Actor``
header, else ``admin``. ``as_member`` (body or query, default the ``X-Qim-Admin-As-Member``
header): the change is made on behalf of the member ``actor``, and the spec 20.2.2 role table
applies to it (a refusal is 403 PERMISSION_DENIED); without it the endpoint acts as the trusted
operator. Success: ``200 {tenant_id, group_id, action, membership_version,
member_count}``. Errors: ``{error, detail?, code?, retry_after_ms?}`` with 400 (bad input),
401 (secret), 403 (PERMISSION_DENIED: no such group, group exists, not allowed - one answer, as
on the client wire), 413 (PAYLOAD_TOO_LARGE), 429 (RATE_LIMITED), 503 (Kafka unreachable,
REGION_FAILOVER), 504 (no AdminReply in time: retrying is safe), 409 (any other refusal).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Final, TypeVar

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from qim.admin.groups import (
    AdminRejected,
    AdminTimeout,
    GroupAdmin,
)
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
from qim.admin.openapi import render
from qim.admin.wire import ADMIN_ACTOR_HEADER, ADMIN_AS_MEMBER_HEADER, ADMIN_SECRET_HEADER
from qim.schemas.frames import ErrorCode
from qim.schemas.records.requests import AdminReply

__all__ = ["make_group_admin_app"]

_MAX_BODY_BYTES: Final = 1024 * 1024  # a create may list thousands of invitees
OPENAPI_PATH: Final = "/v1/openapi.json"
_ADMIN: Final = web.AppKey("group_admin", GroupAdmin)
_STATUS: Final = {
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.REGION_FAILOVER: 503,
    ErrorCode.SHARD_MOVED: 503,
}
_KNOWN: Final = frozenset(int(c) for c in ErrorCode)

log = logging.getLogger(__name__)


class _BadRequest(Exception):
    pass


def _error(status: int, error: str, detail: str = "", **extra: Any) -> web.Response:
    body = AdminErrorBody(
        error=error,
        detail=detail or None,
        code=extra.get("code"),
        retry_after_ms=extra.get("retry_after_ms"),
    )
    return web.Response(
        body=msgspec.json.encode(body), status=status, content_type="application/json"
    )


_B = TypeVar("_B", bound=msgspec.Struct)


async def _decode(request: web.Request, model: type[_B]) -> _B:
    """The body as ``model`` (:mod:`qim.admin.models`); any mismatch is a 400 naming it."""
    try:
        return msgspec.json.decode(await request.read(), type=model)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise _BadRequest(str(exc)) from None


def _text(source: Any, name: str, default: str | None = None) -> str:
    value = source.get(name, default)
    if value is None:
        raise _BadRequest(f"{name} is required")
    if not isinstance(value, str) or not value:
        raise _BadRequest(f"{name} must be a non-empty string")
    return value


def _actor(request: web.Request, given: str | None = None) -> str:
    if given is not None:
        return given
    return _text(request.query, "actor", request.headers.get(ADMIN_ACTOR_HEADER, "admin"))


_TRUE: Final = ("1", "true", "yes")


def _as_member(request: web.Request, given: bool | None = None) -> bool:
    if given is not None:
        return given
    value = request.query.get("as_member", request.headers.get(ADMIN_AS_MEMBER_HEADER, "0"))
    return value.lower() in _TRUE


def _ok(tenant_id: str, group_id: str, action: str, reply: AdminReply) -> web.Response:
    return _encoded(
        GroupChangeReply(
            tenant_id=tenant_id,
            group_id=group_id,
            action=action,  # type: ignore[arg-type]
            membership_version=reply.membership_version,
            member_count=reply.member_count,
        )
    )


async def _create(request: web.Request) -> web.Response:
    body = await _decode(request, CreateGroupBody)
    admin = request.app[_ADMIN]
    reply = await admin.create(
        body.tenant_id, body.group_id, body.owner_id, body.member_ids, e2ee=body.e2ee
    )
    return _ok(body.tenant_id, body.group_id, "create", reply)


async def _add(request: web.Request) -> web.Response:
    body = await _decode(request, AddMembersBody)
    group = request.match_info["group_id"]
    actor, as_member = _actor(request, body.actor), _as_member(request, body.as_member)
    reply = await request.app[_ADMIN].add(
        body.tenant_id, group, body.member_ids, actor, as_member=as_member
    )
    return _ok(body.tenant_id, group, "add", reply)


async def _remove(request: web.Request) -> web.Response:
    group, user = request.match_info["group_id"], request.match_info["user_id"]
    tenant = _text(request.query, "tenant_id")
    ban = request.query.get("ban", "0").lower() in _TRUE
    admin = request.app[_ADMIN]
    as_member = _as_member(request)
    reply = await admin.remove(tenant, group, [user], _actor(request), ban=ban, as_member=as_member)
    return _ok(tenant, group, "ban" if ban else "remove", reply)


async def _set_role(request: web.Request) -> web.Response:
    body = await _decode(request, SetRoleBody)
    group, user = request.match_info["group_id"], request.match_info["user_id"]
    actor, as_member = _actor(request, body.actor), _as_member(request, body.as_member)
    reply = await request.app[_ADMIN].set_role(
        body.tenant_id, group, [user], body.role, actor, as_member=as_member
    )
    return _ok(body.tenant_id, group, "set_role", reply)


async def _transfer(request: web.Request) -> web.Response:
    body = await _decode(request, TransferOwnerBody)
    group = request.match_info["group_id"]
    actor, as_member = _actor(request, body.actor), _as_member(request, body.as_member)
    reply = await request.app[_ADMIN].transfer(
        body.tenant_id, group, body.new_owner_id, actor, as_member=as_member
    )
    return _ok(body.tenant_id, group, "transfer", reply)


async def _dissolve(request: web.Request) -> web.Response:
    group = request.match_info["group_id"]
    tenant = _text(request.query, "tenant_id")
    admin = request.app[_ADMIN]
    reply = await admin.dissolve(tenant, group, _actor(request), as_member=_as_member(request))
    return _ok(tenant, group, "dissolve", reply)


async def _show(request: web.Request) -> web.Response:
    group = request.match_info["group_id"]
    tenant = _text(request.query, "tenant_id")
    reply = await request.app[_ADMIN].show(tenant, group, _actor(request))
    return _ok(tenant, group, "show", reply)


async def _promote(request: web.Request) -> web.Response:
    body = await _decode(request, PromoteRoomBody)
    room = request.match_info["room_id"]
    reply, online = await request.app[_ADMIN].promote_room(
        body.tenant_id, room, body.group_id, body.owner_id
    )
    out = PromoteRoomReply(
        tenant_id=body.tenant_id,
        group_id=body.group_id,
        action="promote",
        room_id=room,
        online_members=list(online),
        membership_version=reply.membership_version,
        member_count=reply.member_count,
    )
    return _encoded(out)


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(text=render(), content_type="application/json")


def _encoded(body: msgspec.Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _guard(admin_secret: bytes) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        presented = request.headers.get(ADMIN_SECRET_HEADER, "").encode("utf-8", "replace")
        public = request.method == "GET" and request.path == OPENAPI_PATH
        if not public and not hmac.compare_digest(presented, admin_secret):
            return _error(401, "unauthorized")
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (_BadRequest, ValueError) as exc:  # ours and the id validators'
            return _error(400, "bad_request", str(exc))
        except AdminRejected as exc:
            e = exc.error
            status = _STATUS.get(ErrorCode(e.code), 409) if e.code in _KNOWN else 409
            return _error(
                status, exc.code_name, e.detail, code=e.code, retry_after_ms=e.retry_after_ms
            )
        except AdminTimeout as exc:
            return _error(504, "timeout", str(exc))
        except Exception as exc:  # the producer: Kafka unreachable, metadata timeout
            log.exception("group admin %s %s failed", request.method, request.path)
            return _error(503, "unavailable", f"request not produced: {exc!r}")

    return guard


def make_group_admin_app(admin: GroupAdmin, admin_secret: str) -> web.Application:
    """The app; every route requires ``X-Qim-Admin-Secret: <admin_secret>`` (>= 16 chars)."""
    if len(admin_secret) < 16:
        raise ValueError("admin_secret must be at least 16 characters")
    app = web.Application(
        middlewares=[_guard(admin_secret.encode("utf-8"))], client_max_size=_MAX_BODY_BYTES
    )
    app[_ADMIN] = admin
    app.router.add_post("/v1/groups", _create)
    app.router.add_post("/v1/groups/{group_id}/members", _add)
    app.router.add_delete("/v1/groups/{group_id}/members/{user_id}", _remove)
    app.router.add_get("/v1/groups/{group_id}/members", _show)
    app.router.add_put("/v1/groups/{group_id}/members/{user_id}/role", _set_role)
    app.router.add_post("/v1/groups/{group_id}/owner", _transfer)
    app.router.add_delete("/v1/groups/{group_id}", _dissolve)
    app.router.add_post("/v1/rooms/{room_id}/promote", _promote)
    app.router.add_get(OPENAPI_PATH, _openapi)
    return app
