"""What happens between AUTH and AUTH_OK on a ConnectionNode (§5.3.2, §5.4, §15.2, §15.3.1).

1. AuthService validates the token and allocates session_epoch (the only Redis access of a
   connection's life, direction.md §1). A refusal becomes ERROR{TOKEN_EXPIRED | TOKEN_REVOKED
   | UPGRADE_REQUIRED{minimum_client_version} | PERMISSION_DENIED} + close.
2. Ownership: the user's ConnectionShard must be ours. If not: REDIRECT{route_token,
   connection_shard, endpoint_hint, exp} + close; if the client already presented a route
   token (it followed its one redirect, ``redirect_max_per_connection`` = 1): ERROR{SHARD_MOVED,
   retry_after_ms} + close (§5.3.2).
3. Devices: the registry replaces the same device_id (larger epoch wins) or evicts the least
   recently active beyond ``max_devices_per_user``; the losers get KICKED.
4. With login sync on, between 2 and 3: the MailboxNode checks the AUTH's cursor and snapshots
   ``sync_to_seq`` (§9.3.1, :class:`~qim.gateway.ports.MailboxLogin`). Before the device
   registry, on purpose: a cursor refused or a shard that does not answer must not have kicked
   the device's live connection, and a login that is still waiting holds no registry slot a
   closing socket could leak. A cursor verdict (CURSOR_INVALID / _EXPIRED / _REBASED) is sent
   and the connection closed, like every other refused AUTH here: the state table has no way
   back to AWAITING_AUTH, and the client's next step is a new AUTH anyway (re-authenticate,
   REBUILD re-handshake, replay with the new cursor - A.6); SHARD_MOVED{retry_after_ms} (no
   answer within ``mailbox_sync_timeout_ms``) closes as the ConnectionShard one does.
5. AUTH_OK (with the sync fields), then the PresenceEntry (after AUTH_OK, §7.10); an evicted
   device's entry is tombstoned first. The entry follows the ``sync_to_seq`` snapshot, so an
   event materialized in between may miss the realtime push; the SDK's login therefore ends
   with one ``PULL_MAILBOX(cursor, 0)`` top-up (the digest's "login race", ``qim.client.login``).

A failure of ours (AuthService unreachable) is not the client's fault: ERROR{RATE_LIMITED,
retry_after_ms} with jitter, the back-off instruction §15.2.3 uses for server-side pressure.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from qim.gateway.actions import Authenticate, CloseReason
from qim.gateway.devices import DeviceRegistry
from qim.gateway.metrics import GatewayMetrics
from qim.gateway.ports import (
    Authenticator,
    AuthGrant,
    AuthRejected,
    MailboxLogin,
    Ownership,
    PresenceSink,
)
from qim.gateway.states import ConnState
from qim.schemas import connection_shard_id, lane_id, user_bucket
from qim.schemas.frames import Error, ErrorCode, MailboxCursor, Redirect, for_code
from qim.schemas.records.presence import PresenceEntry, PresenceKey
from qim.schemas.records.user_requests import AuthSyncResult

if TYPE_CHECKING:
    from qim.gateway.config import GatewayConfig
    from qim.gateway.transport.connection import Connection

__all__ = ["LoginFlow", "jittered"]

log = logging.getLogger(__name__)

_CURSOR_CODES = frozenset(
    int(c) for c in (ErrorCode.CURSOR_INVALID, ErrorCode.CURSOR_EXPIRED, ErrorCode.CURSOR_REBASED)
)


def jittered(base_ms: int, jitter: float = 0.3) -> int:
    """base × (1 ± jitter): never the same retry_after_ms for everyone (§15.2.3)."""
    return max(1, int(base_ms * (1 + random.uniform(-jitter, jitter))))


class LoginFlow:
    """Runs one AUTH to its end; owned by the ConnectionNode."""

    def __init__(
        self,
        config: GatewayConfig,
        authenticator: Authenticator,
        ownership: Ownership,
        registry: DeviceRegistry[Connection],
        presence: PresenceSink,
        metrics: GatewayMetrics,
        clock_ms: Callable[[], int],
    ) -> None:
        self.config = config
        self.auth = authenticator
        self.ownership = ownership
        self.registry = registry
        self.presence = presence
        self.metrics = metrics
        self.clock_ms = clock_ms
        s = config.settings
        self._vbc = int(s.virtual_bucket_count)
        self._conn_shards = int(s.connection_shard_count)
        self._lanes = int(s.lane_count)
        self._lease_ttl = int(s.presence_lease_ttl)
        self._route_ttl = int(s.route_token_ttl)
        self.backoff_ms = int(s.reconnect_backoff.initial_ms)
        self.mailbox: MailboxLogin | None = None  # login sync (``mailbox_sync``): set by the node

    async def run(self, conn: Connection, action: Authenticate) -> None:
        request = action.request
        try:
            if action.renewal:
                current = conn.session.grant
                assert current is not None
                grant = await self.auth.renew(request, current)
                if (grant.tenant_id, grant.user_id, grant.device_id) != (
                    current.tenant_id,
                    current.user_id,
                    current.device_id,
                ):
                    raise AuthRejected(ErrorCode.PERMISSION_DENIED, "token of another identity")
            else:
                grant = await self.auth.authenticate(request)
        except AuthRejected as exc:
            self.metrics.on_auth(exc.code.name.lower())
            conn.apply(conn.session.auth_rejected(exc.to_error(), self.clock_ms()))
            return
        except Exception:
            log.exception("authenticator failed for %r", conn)
            self.metrics.on_auth("internal_error")
            error = Error(
                code=int(ErrorCode.RATE_LIMITED),
                retry_after_ms=jittered(self.backoff_ms),
                detail="authentication temporarily unavailable",
            )
            conn.apply(conn.session.auth_rejected(error, self.clock_ms()))
            return
        if action.renewal:
            self._accept(conn, grant, request.now_ms)
        else:
            await self._first_login(conn, grant, request.now_ms, action.cursor)

    def shard_of(self, tenant_id: str, user_id: str) -> int:
        """The user's ConnectionShard (§5.2)."""
        return connection_shard_id(user_bucket(tenant_id, user_id, self._vbc), self._conn_shards)

    async def _first_login(
        self, conn: Connection, grant: AuthGrant, started_ms: int, cursor: MailboxCursor | None
    ) -> None:
        shard = self.shard_of(grant.tenant_id, grant.user_id)
        if not self.ownership.owns(shard):
            await self._redirect(conn, grant, shard, grant.redirected)
            return
        if conn.session.state is not ConnState.AUTHENTICATING:
            return  # closed meanwhile (unauth timeout, peer gone): nothing to register
        sync: AuthSyncResult | None = None
        if self.mailbox is not None:
            outcome = await self.mailbox.sync_auth(
                grant, cursor, connection_shard=shard, request_id=conn.session.auth_request_id
            )
            if conn.session.state is not ConnState.AUTHENTICATING:
                return  # closed while the MailboxNode answered
            if isinstance(outcome, Error):
                self._sync_refused(conn, outcome)
                return
            if not self.ownership.owns(shard):  # lost during the wait: as if never ours
                await self._redirect(conn, grant, shard, grant.redirected)
                return
            sync = outcome
        now = self.clock_ms()
        admission = self.registry.admit(
            grant.tenant_id, grant.user_id, grant.device_id, grant.session_epoch, conn, now
        )
        if not admission.admitted:
            self.metrics.on_auth("stale_session_epoch")
        for kick in admission.kicks:
            self.metrics.kicked.labels(reason=kick.reason).inc()
            kick.conn.apply(kick.conn.session.kick(kick.reason, kick.replaced_by_device, now))
            if admission.admitted and kick.device_id != grant.device_id:
                self.presence.tombstone(PresenceKey(grant.tenant_id, grant.user_id, kick.device_id))
                self.metrics.presence.labels(kind="tombstone").inc()
        if not admission.admitted:
            return
        self._accept(conn, grant, started_ms, sync)
        self.publish(conn, shard)

    def _sync_refused(self, conn: Connection, error: Error) -> None:
        """The MailboxNode's ERROR instead of AUTH_OK (§9.3.1), then close (see the docstring)."""
        self.metrics.on_auth(for_code(error.code).name.lower())
        now = self.clock_ms()
        if error.code in _CURSOR_CODES:
            conn.apply(conn.session.auth_rejected(error, now, CloseReason.CURSOR_REJECTED))
        else:
            conn.apply(conn.session.refuse(error, now))

    def _accept(
        self,
        conn: Connection,
        grant: AuthGrant,
        started_ms: int,
        sync: AuthSyncResult | None = None,
    ) -> None:
        now = self.clock_ms()
        lane = lane_id(grant.tenant_id, grant.user_id, self._lanes)
        conn.apply(
            conn.session.auth_accepted(
                grant,
                now_ms=now,
                lane_id=lane,
                preferred_endpoint=self.config.advertised_endpoint,
                sync=sync,
            )
        )
        if conn.session.grant is not None and not conn.session.closed:
            conn.authenticated()  # before AUTH_OK's bytes leave: the next frame may be large
        self.metrics.on_auth("ok", latency_ms=now - started_ms)
        self.metrics.ping_interval.observe(conn.session.config.next_ping_interval_ms)

    async def _redirect(
        self, conn: Connection, grant: AuthGrant, shard: int, redirected: bool
    ) -> None:
        now = self.clock_ms()
        body: Redirect | Error
        if redirected:  # the one redirect was spent: back off instead (§5.3.2)
            body = Error(
                code=int(ErrorCode.SHARD_MOVED),
                retry_after_ms=jittered(self.backoff_ms),
                detail=f"connection_shard {shard} is not served here",
            )
            self.metrics.on_auth("shard_moved")
        else:
            token = await self.auth.issue_route_token(grant, shard, now)
            body = Redirect(
                route_token=b"" if token is None else token.token,
                connection_shard=shard,
                endpoint_hint=self.ownership.owner_endpoint(shard) or "",
                exp=now + self._route_ttl if token is None else token.exp_ms,
            )
            self.metrics.on_auth("redirect")
        conn.apply(conn.session.refuse(body, self.clock_ms()))

    def publish(self, conn: Connection, shard: int | None = None) -> None:
        """Write (or renew) the PresenceEntry of an online connection."""
        grant = conn.session.grant
        if grant is None or conn.session.closed:
            return
        if shard is None:
            shard = self.shard_of(grant.tenant_id, grant.user_id)
        entry = PresenceEntry(
            tenant_id=grant.tenant_id,
            user_id=grant.user_id,
            device_id=grant.device_id,
            connection_id=conn.conn_id,
            node_id=self.config.node_id,
            connection_shard=shard,
            session_epoch=grant.session_epoch,
            capabilities=conn.session.capabilities,
            protocol_version=conn.session.version,
            lease_expire_at=self.clock_ms() + self._lease_ttl,
        )
        self.presence.publish(entry)
        self.metrics.presence.labels(kind="upsert").inc()
