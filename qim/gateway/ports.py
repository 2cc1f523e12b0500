"""The seams a ConnectionNode calls: authentication, shard ownership, presence publishing.

Each seam is a Protocol so the node never imports a concrete service at module import time:
``qim.auth.AuthService`` is wrapped by :mod:`qim.gateway.auth_adapter`, Kafka group ownership
lives in ``qim.gateway.ownership.shards``, the presence writer in
:mod:`qim.gateway.presence_writer`, and the MailboxNode's login answer in
:mod:`qim.gateway.routing.mailbox_requests`.
Tests plug in-memory doubles into the same seams (style.md item 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qim.schemas.frames import Error, ErrorCode, MailboxCursor
from qim.schemas.records.presence import PresenceEntry, PresenceKey
from qim.schemas.records.user_requests import AuthSyncResult

__all__ = [
    "AuthGrant",
    "AuthRejected",
    "AuthRequest",
    "Authenticator",
    "MailboxLogin",
    "OwnAll",
    "Ownership",
    "PresenceSink",
    "RouteToken",
]


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What the node hands the authenticator for one AUTH frame (A.3 #1)."""

    access_token: str
    device_id: str
    client_version: str
    capabilities: int
    now_ms: int
    peer: str = ""
    route_token: bytes = b""  # presented after a REDIRECT (§15.2.1 (3)); see session.py
    protocol_version: int = 1


@dataclass(frozen=True, slots=True)
class AuthGrant:
    """A successful authentication: the identity and its session_epoch (allocated by AuthService).

    ``session_epoch`` is scoped to (tenant_id, user_id, device_id) and strictly increasing
    (§5.4.4); the node only carries it. ``token_expires_at_ms`` is None when unknown.
    ``redirected``: the request carried a route token that verified for this identity and was
    consumed (single use); an invalid one is ignored, as if none had been presented.
    """

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int
    token_expires_at_ms: int | None = None
    redirected: bool = False  # a valid, unused route token came with the AUTH (§5.3.2)
    token_id: str | None = None  # which token, for live revocation (qim.revocations)
    token_issued_at_ms: int | None = None  # a device / user watermark revokes it if <= at


class AuthRejected(Exception):
    """The token or client is refused; ``code`` is the A.6 code the client gets in ERROR."""

    def __init__(
        self,
        code: ErrorCode,
        detail: str = "",
        *,
        minimum_client_version: str | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {detail}")
        self.code = code
        self.detail = detail
        self.minimum_client_version = minimum_client_version
        self.retry_after_ms = retry_after_ms

    def to_error(self) -> Error:
        """The ERROR body; extras only where A.6 declares them for the code."""
        return Error(
            code=int(self.code),
            detail=self.detail,
            retry_after_ms=self.retry_after_ms,
            minimum_client_version=(
                self.minimum_client_version if self.code is ErrorCode.UPGRADE_REQUIRED else None
            ),
        )


@dataclass(frozen=True, slots=True)
class RouteToken:
    """A REDIRECT's single-use token (§20.2.1): opaque bytes and expiry in epoch ms."""

    token: bytes
    exp_ms: int


class Authenticator(Protocol):
    """AuthService as the node sees it. Only login touches Redis (direction.md §1)."""

    async def authenticate(self, request: AuthRequest) -> AuthGrant:
        """First AUTH: validate the token (and consume a presented route token), allocate the
        next session_epoch; raise AuthRejected."""
        ...

    async def renew(self, request: AuthRequest, grant: AuthGrant) -> AuthGrant:
        """Re-AUTH on a live connection (§15.3.1): validate only, session_epoch unchanged."""
        ...

    async def issue_route_token(
        self, grant: AuthGrant, connection_shard: int, now_ms: int
    ) -> RouteToken | None:
        """A route token for REDIRECT, or None when this authenticator cannot issue one."""
        ...


class Ownership(Protocol):
    """Who owns a ConnectionShard (Kafka group assignment on the to-gateway topic, §4.1)."""

    def owns(self, connection_shard_id: int) -> bool: ...

    def owner_endpoint(self, connection_shard_id: int) -> str | None: ...


class OwnAll:
    """A single gateway that owns every ConnectionShard (local runs, tests)."""

    def __init__(self, endpoint: str = "") -> None:
        self._endpoint = endpoint

    def owns(self, connection_shard_id: int) -> bool:
        return True

    def owner_endpoint(self, connection_shard_id: int) -> str | None:
        return self._endpoint or None


class PresenceSink(Protocol):
    """Where PresenceEntry records go (the compacted presence topic in production)."""

    def publish(self, entry: PresenceEntry) -> None:
        """Queue an upsert; never blocks the socket path."""
        ...

    def tombstone(self, key: PresenceKey) -> None:
        """Queue a null-value record for the key (clean disconnect)."""
        ...


class MailboxLogin(Protocol):
    """The MailboxNode as a login sees it (§9.3.1): the cursor checks and AUTH_OK's sync part."""

    async def sync_auth(
        self,
        grant: AuthGrant,
        cursor: MailboxCursor | None,
        *,
        connection_shard: int,
        request_id: int = 0,
    ) -> AuthSyncResult | Error:
        """AUTH_OK's sync fields, or the ERROR to send instead: CURSOR_INVALID / _EXPIRED /
        _REBASED (the cursor's verdict) or SHARD_MOVED{retry_after_ms} (no answer in time)."""
        ...
