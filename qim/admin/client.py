"""A small synchronous client of the group admin endpoint (``qim group ...``, scripts).

Synchronous on purpose: one request per CLI call, no event loop needed. Path segments are
percent-encoded (group ids contain ``:``, user ids may contain anything the id rules allow).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from qim.admin.wire import ADMIN_ACTOR_HEADER, ADMIN_AS_MEMBER_HEADER, ADMIN_SECRET_HEADER

__all__ = ["AdminHttpError", "AdminUnreachable", "GroupAdminClient"]


class AdminHttpError(Exception):
    """The endpoint answered with an error status; ``body`` is its JSON (or the raw text)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        error = body.get("error", "error")
        detail = body.get("detail")
        super().__init__(f"HTTP {status} {error}" + (f": {detail}" if detail else ""))

    @property
    def retryable(self) -> bool:
        """503/504/429: the operation may succeed later (retrying is safe)."""
        return self.status in (429, 503, 504)


class AdminUnreachable(Exception):
    """No HTTP answer at all (refused, DNS, timeout)."""


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class GroupAdminClient:
    """``url`` like ``http://127.0.0.1:16091``; ``timeout_s`` should exceed the server's wait.

    ``as_member``: every change is made on behalf of the member ``actor`` (roles apply)."""

    def __init__(
        self,
        url: str,
        admin_secret: str,
        *,
        actor: str | None = None,
        timeout_s: float = 20.0,
        as_member: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {ADMIN_SECRET_HEADER: admin_secret}
        if actor:
            self._headers[ADMIN_ACTOR_HEADER] = actor
        if as_member:
            if not actor:
                raise ValueError("as_member needs the member's user id as actor")
            self._headers[ADMIN_AS_MEMBER_HEADER] = "1"
        self.timeout_s = timeout_s

    def create(
        self,
        tenant_id: str,
        group_id: str,
        owner_id: str,
        member_ids: Sequence[str] = (),
        *,
        e2ee: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "tenant_id": tenant_id,
            "group_id": group_id,
            "owner_id": owner_id,
            "member_ids": list(member_ids),
        }
        if e2ee:
            body["e2ee"] = True
        return self._call("POST", "/v1/groups", body=body)

    def add(self, tenant_id: str, group_id: str, member_ids: Sequence[str]) -> dict[str, Any]:
        body = {"tenant_id": tenant_id, "member_ids": list(member_ids)}
        return self._call("POST", f"/v1/groups/{_segment(group_id)}/members", body=body)

    def remove(
        self, tenant_id: str, group_id: str, user_id: str, *, ban: bool = False
    ) -> dict[str, Any]:
        query = {"tenant_id": tenant_id, "ban": "1" if ban else "0"}
        path = f"/v1/groups/{_segment(group_id)}/members/{_segment(user_id)}"
        return self._call("DELETE", path, query=query)

    def show(self, tenant_id: str, group_id: str) -> dict[str, Any]:
        path = f"/v1/groups/{_segment(group_id)}/members"
        return self._call("GET", path, query={"tenant_id": tenant_id})

    def set_role(self, tenant_id: str, group_id: str, user_id: str, role: str) -> dict[str, Any]:
        """Grant or revoke ADMIN (``role`` ADMIN, MEMBER or GUEST)."""
        path = f"/v1/groups/{_segment(group_id)}/members/{_segment(user_id)}/role"
        return self._call("PUT", path, body={"tenant_id": tenant_id, "role": role})

    def transfer(self, tenant_id: str, group_id: str, new_owner_id: str) -> dict[str, Any]:
        """Make ``new_owner_id`` the OWNER; the previous owner becomes a MEMBER."""
        body = {"tenant_id": tenant_id, "new_owner_id": new_owner_id}
        return self._call("POST", f"/v1/groups/{_segment(group_id)}/owner", body=body)

    def dissolve(self, tenant_id: str, group_id: str) -> dict[str, Any]:
        """End the group: members are released, later sends are PERMISSION_DENIED."""
        path = f"/v1/groups/{_segment(group_id)}"
        return self._call("DELETE", path, query={"tenant_id": tenant_id})

    def promote_room(
        self, tenant_id: str, room_id: str, group_id: str, owner_id: str
    ) -> dict[str, Any]:
        """14.4: the room's online members become the group's initial members."""
        body = {"tenant_id": tenant_id, "group_id": group_id, "owner_id": owner_id}
        return self._call("POST", f"/v1/rooms/{_segment(room_id)}/promote", body=body)

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            raise AdminHttpError(exc.code, _decode(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminUnreachable(f"{self.url} did not answer: {exc}") from None


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"error": "non-json response", "detail": raw[:200].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"error": "unexpected response", "detail": raw}
