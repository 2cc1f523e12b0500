"""One client connection as a sans-I/O object: bytes and time in, actions out (style.md item 1).

The driver feeds WebSocket messages (``receive_message``) or TCP bytes (``receive_data``), the
authenticator's verdict (``auth_accepted`` / ``auth_rejected``), the node's decisions
(``refuse``, ``kick``, ``shutdown``) and the clock (``tick``); each call returns the
:mod:`~qim.gateway.actions` to perform. State moves only along :mod:`~qim.gateway.states`.

Rules and where they come from:

* first frame must be AUTH; anything else before AUTH_OK -> ERROR{PERMISSION_DENIED} + close
  (§20.2.2: every authorization failure is PERMISSION_DENIED; an unauthenticated peer has none);
* AUTH while one is in flight, or a re-AUTH naming another device_id -> ERROR{PERMISSION_DENIED}
  + close (§15.3.1); a re-AUTH for the same device is the silent renewal of §15.3.1;
* decode errors -> the codec's verdict: ERROR{code} when it names one, then close (§20.1);
  B.5 field limits -> ERROR, connection kept (exceptions.py table);
* unknown opcode once online -> dropped and counted, ERROR{UPGRADE_REQUIRED} iff request_id != 0
  (§27.1.2); before AUTH it is just "not AUTH" (no version was negotiated yet);
* PING -> PONG{ping_id, server_time, echo_client_time, last_pushed_user_seq, mailbox_dirty,
  next_ping_interval_ms, idle_timeout_ms} on stream 0 (§15.1); no watermark (§6.10.1);
* deadlines: ``unauth_connection_timeout`` from open until AUTH_OK, then ``idle_timeout`` after
  the last valid inbound frame (§15.1.5: any valid frame refreshes last_active_at, lazily);
* login sync (when the node asks the MailboxNode at AUTH): AUTH_OK carries its sync fields and
  starts the session's :class:`~qim.gateway.sync_barrier.LoginBarrier`, which answers
  SYNC_COMPLETE itself (§9.3.4); without it SYNC_COMPLETE is forwarded like any frame;
* token expiry (§15.3.1, INV-48): past the grant's ``token_expires_at_ms`` writes get
  ERROR{TOKEN_EXPIRED} for ``token_expiry_grace``, then ERROR{TOKEN_EXPIRED} + close (a frame
  or the deadline, whichever comes first); rules in :mod:`~qim.gateway.token_expiry`;
* online pushes (§9.4, §11.1.1): AUTH_OK creates the session's
  :class:`~qim.core.push.ConnectionPush` at ``sync_to_seq``; :meth:`Session.push` feeds it one
  expanded delivery (:mod:`~qim.gateway.session_push`: raw PUSH_EVENTS bytes on stream 1, the
  ledger drained only when the driver sees them leave the socket, 11.3). Pushes above
  ``sync_to_seq`` wait for ONLINE_READY (the sync barrier's release calls
  ``ConnectionPush.sync_complete``); a session without login sync is released at AUTH_OK.
  PONG reports ``ConnectionPush.pong()``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec

from qim.core.push import DEFAULT_FLOW_LIMITS, ConnectionPush, FlowLimits
from qim.gateway.actions import Action, Authenticate, Close, CloseReason, Count, Forward, Send
from qim.gateway.login import auth_request, check_credentials, upgrade_required
from qim.gateway.ports import AuthGrant
from qim.gateway.session_push import SessionPushes
from qim.gateway.states import ConnState, ConnStateMachine, Event
from qim.gateway.sync_barrier import LoginBarrier
from qim.gateway.token_expiry import TokenPhase, close_at_ms, expired_error, is_write, token_phase
from qim.schemas.frames import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Auth,
    AuthOk,
    Body,
    Error,
    ErrorCode,
    Frame,
    FrameDecoder,
    FrameTooLarge,
    Kicked,
    LimitExceeded,
    Limits,
    Ping,
    Pong,
    ProtocolError,
    Redirect,
    Role,
    SyncComplete,
    UnknownFrame,
    negotiate_version,
)
from qim.schemas.records.user_requests import AuthSyncResult

__all__ = ["Session", "SessionConfig"]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Per-connection timing and limits (App. B.4/B.5 defaults; tests shrink them)."""

    unauth_timeout_ms: int = 10_000
    next_ping_interval_ms: int = 240_000
    idle_timeout_ms: int = 490_000  # next_ping_interval × 2 + 10 s (§15.1.3)
    frag_assembly_timeout_ms: int = 30_000  # B.5: an unfinished reassembly is dropped + closed
    limits: Limits = DEFAULT_LIMITS
    server_versions: tuple[int, ...] = SUPPORTED_VERSIONS
    flow: FlowLimits = DEFAULT_FLOW_LIMITS  # conn_send_{soft,hard,low}_watermark (B.5, 11.3)
    token_expiry_grace_ms: int = 300_000  # B.4 token_expiry_grace: read-only after expiry


class Session(SessionPushes):
    """Protocol state of one connection; every method takes ``now_ms`` (epoch ms)."""

    def __init__(self, config: SessionConfig, *, now_ms: int, peer: str = "") -> None:
        self.config = config
        self.peer = peer
        self.opened_at_ms = now_ms
        self.last_active_ms = now_ms
        self.grant: AuthGrant | None = None  # set at AUTH_OK
        self.lane_id = 0
        self.capabilities = 0
        self.version = PROTOCOL_VERSION  # Ve after AUTH (§27.1.1)
        self.last_pushed_user_seq = 0  # starts at AUTH_OK.sync_to_seq (§15.1.1)
        self.last_applied_mailbox_seq = 0  # the largest PING cursor (16.1.2 APPLIED evidence)
        self.sync_to_seq = 0  # AUTH_OK.sync_to_seq: below it the login pull delivered
        self.mailbox_dirty = False
        self.sync: LoginBarrier | None = None  # set at AUTH_OK when the login was synced
        self.pushes: ConnectionPush | None = None  # set at AUTH_OK (online delivery)
        self.close_reason: CloseReason | None = None
        self._machine = ConnStateMachine()
        self._decoder = FrameDecoder(Role.SERVER, limits=config.limits)
        # Until AUTH_OK at most one AUTH-sized frame is held (issue 15.2, spec 20.1).
        self._decoder.restrict(config.limits.pre_auth_max_frame_bytes)
        self._auth_request_id = 0
        self._frag_since_ms: int | None = None

    @property
    def state(self) -> ConnState:
        return self._machine.state

    @property
    def auth_request_id(self) -> int:
        """The request_id of the AUTH being answered (echoed by its verdict, A.1)."""
        return self._auth_request_id

    @property
    def closed(self) -> bool:
        return self._machine.state is ConnState.CLOSED

    @property
    def buffered_bytes(self) -> int:
        """Inbound octets held (unparsed + fragment reassemblies): bounded by the codec."""
        return self._decoder.buffered_bytes + self._decoder.reassembly_bytes

    def deadline_ms(self) -> int | None:
        """When ``tick`` would close this connection if nothing valid arrives meanwhile."""
        state = self._machine.state
        if state is ConnState.CLOSED:
            return None
        if state in (ConnState.AWAITING_AUTH, ConnState.AUTHENTICATING):
            deadline = self.opened_at_ms + self.config.unauth_timeout_ms
        else:
            deadline = self.last_active_ms + self.config.idle_timeout_ms
            token = self._token_close_at_ms()
            deadline = deadline if token is None else min(deadline, token)
        frag = self._frag_deadline_ms()
        return deadline if frag is None else min(deadline, frag)

    def _token_close_at_ms(self) -> int | None:
        exp = None if self.grant is None else self.grant.token_expires_at_ms
        return close_at_ms(exp, self.config.token_expiry_grace_ms)

    def _token_phase(self, now_ms: int) -> TokenPhase:
        exp = None if self.grant is None else self.grant.token_expires_at_ms
        return token_phase(exp, self.config.token_expiry_grace_ms, now_ms)

    def _frag_deadline_ms(self) -> int | None:
        since = self._frag_since_ms
        return None if since is None else since + self.config.frag_assembly_timeout_ms

    def _track_fragments(self, now_ms: int) -> None:
        if not self._decoder.incomplete_streams:
            self._frag_since_ms = None
        elif self._frag_since_ms is None:
            self._frag_since_ms = now_ms

    # -- bytes in ---------------------------------------------------------------------------

    def receive_message(self, message: bytes | bytearray | memoryview, now_ms: int) -> list[Action]:
        """One WebSocket binary message = one frame (or one fragment of one)."""
        if self.closed:
            return []
        try:
            frame = self._decoder.receive_message(message)
        except ProtocolError as exc:
            return self._protocol_error(exc)
        self._track_fragments(now_ms)
        return [] if frame is None else self.receive_frame(frame, now_ms)

    def receive_data(self, data: bytes | bytearray | memoryview, now_ms: int) -> list[Action]:
        """TCP stream octets; yields actions for every complete frame."""
        actions: list[Action] = []
        if self.closed:
            return actions
        self._decoder.receive_data(data)
        while not self.closed:
            try:
                frame = self._decoder.next_frame()
            except ProtocolError as exc:
                actions += self._protocol_error(exc)
                continue
            if frame is None:
                break
            actions += self.receive_frame(frame, now_ms)
        self._track_fragments(now_ms)
        return actions

    def receive_frame(self, frame: Frame | UnknownFrame, now_ms: int) -> list[Action]:
        """Dispatch one decoded frame by the current state."""
        if self.closed:
            return []
        version = frame.header.version
        if self.grant is not None and version not in self.config.server_versions:
            return self._bad_version(version, frame.header.request_id)
        if isinstance(frame, UnknownFrame):
            return self._unknown(frame, now_ms)
        body = frame.body
        if isinstance(body, Auth):
            return self._auth(frame, body, now_ms)
        if isinstance(body, Ping):
            return self._ping(frame, body, now_ms)
        self._fire(Event.FRAME)
        if self.closed:
            return self._denied("frame before AUTH_OK", frame.header.request_id)
        self.last_active_ms = now_ms
        gated = self._token_gate(body, frame.header.request_id, now_ms)
        if gated is not None:
            return gated
        if self.sync is not None and isinstance(body, SyncComplete):
            actions = self.sync.complete(frame.header.request_id, body, self.version)
            return actions + self._release_pushes()
        return [Forward(frame)]

    # -- node decisions in -----------------------------------------------------------------

    def auth_accepted(
        self,
        grant: AuthGrant,
        *,
        now_ms: int,
        lane_id: int = 0,
        preferred_endpoint: str = "",
        sync_delay_hint_ms: int = 0,
        sync: AuthSyncResult | None = None,
    ) -> list[Action]:
        """AUTH_OK. On a renewal the session_epoch stays as it was (§15.3.1) and nothing is
        synced; ``sync`` (a first login's MailboxNode answer) fills the sync fields, starts the
        login barrier and ``last_pushed_user_seq`` at ``sync_to_seq`` (§15.1.1)."""
        renewal = self._machine.state is ConnState.RENEWING
        if self._fire(Event.AUTH_ACCEPTED) is ConnState.CLOSED:
            return []
        if renewal and self.grant is not None:  # only the expiry moves (AT-93)
            exp = grant.token_expires_at_ms
            self.grant = replace(
                self.grant,
                token_expires_at_ms=exp,
                token_id=grant.token_id,
                token_issued_at_ms=grant.token_issued_at_ms,
            )
        else:
            self.grant, self.lane_id = grant, lane_id
            self._decoder.lift()
            if sync is not None:
                self.sync, self.lane_id = LoginBarrier(sync), sync.lane_id
                self.last_pushed_user_seq = self.sync_to_seq = sync.sync_to_seq
            self.pushes = ConnectionPush(self.last_pushed_user_seq, limits=self.config.flow)
            if self.sync is None:  # nothing to sync: realtime pushes flow at once
                self.pushes.sync_complete()
        self.last_active_ms = now_ms
        current = self.grant
        assert current is not None
        fields: dict[str, Any] = {
            "session_epoch": current.session_epoch,
            "preferred_endpoint": preferred_endpoint,
            "sync_delay_hint_ms": sync_delay_hint_ms,
            "next_ping_interval_ms": self.config.next_ping_interval_ms,
        }
        if self.sync is not None and not renewal:
            ok = self.sync.auth_ok(**fields)
        else:
            ok = AuthOk(lane_id=self.lane_id, sync_to_seq=self.last_pushed_user_seq, **fields)
        return [Send(ok, request_id=self._auth_request_id, version=self.version)]

    def auth_rejected(
        self, error: Error, now_ms: int, reason: CloseReason = CloseReason.AUTH_FAILED
    ) -> list[Action]:
        """ERROR{TOKEN_EXPIRED | TOKEN_REVOKED | UPGRADE_REQUIRED | PERMISSION_DENIED ...}, or
        a cursor verdict of the login sync (``CloseReason.CURSOR_REJECTED``, §9.3.1)."""
        if self._fire(Event.AUTH_REJECTED) is ConnState.CLOSED:
            return []
        return self._final(self._echo(error), reason, error.detail)

    def refuse(self, body: Redirect | Error, now_ms: int) -> list[Action]:
        """REDIRECT, or ERROR{SHARD_MOVED | RATE_LIMITED}, then close (§5.3.2, §15.2.3); once
        online only SHARD_MOVED applies (the node lost the ConnectionShard)."""
        if self._fire(Event.REFUSE) is ConnState.CLOSED:
            return []
        if isinstance(body, Redirect):
            return self._final(body, CloseReason.REDIRECTED, "redirect")
        return self._final(self._echo(body), CloseReason.REFUSED, body.detail)

    def kick(self, reason: str, replaced_by_device: str | None, now_ms: int) -> list[Action]:
        """KICKED{reason, replaced_by_device} then close (§5.4.4, §15.2.2)."""
        if self._fire(Event.KICK) is ConnState.CLOSED:
            return []
        body = Kicked(reason=reason, replaced_by_device=replaced_by_device)
        return self._final(body, CloseReason.KICKED, reason)

    def tick(self, now_ms: int) -> list[Action]:
        """Close when the current deadline has passed; a no-op otherwise."""
        deadline = self.deadline_ms()
        if deadline is None or now_ms < deadline:
            return []
        unauth = self._machine.state in (ConnState.AWAITING_AUTH, ConnState.AUTHENTICATING)
        frag = self._frag_deadline_ms()
        token = None if unauth else self._token_close_at_ms()
        self._fire(Event.TIMEOUT)
        if frag is not None and now_ms >= frag:
            return self._close(CloseReason.PROTOCOL_ERROR, "frag_assembly_timeout")
        if token is not None and now_ms >= token:
            return self._token_closed(0)
        reason = CloseReason.UNAUTH_TIMEOUT if unauth else CloseReason.IDLE_TIMEOUT
        return self._close(reason, f"no valid frame for {now_ms - self.last_active_ms} ms")

    def peer_closed(self, now_ms: int) -> list[Action]:
        if self._fire(Event.PEER_CLOSED) is ConnState.CLOSED:
            return []
        return self._close(CloseReason.PEER_CLOSED)

    def shutdown(self, reason: CloseReason, now_ms: int, detail: str = "") -> list[Action]:
        """The node ends the connection (stopping, slow consumer ...); no frame is sent."""
        if self._fire(Event.SHUTDOWN) is ConnState.CLOSED:
            return []
        return self._close(reason, detail)

    # -- internals ----------------------------------------------------------------------------

    def _fire(self, event: Event) -> ConnState:
        return self._machine.fire(event)

    def _echo(self, error: Error) -> Error:
        """An ERROR answering the AUTH carries its request_id (A.1: pairs request and reply)."""
        if error.request_id or not self._auth_request_id:
            return error
        return msgspec.structs.replace(error, request_id=self._auth_request_id)

    def _close(self, reason: CloseReason, detail: str = "") -> list[Action]:
        self.close_reason = reason
        return [Close(reason, detail)]

    def _final(
        self, body: Error | Kicked | Redirect | None, reason: CloseReason, detail: str
    ) -> list[Action]:
        """The last frame (if any) on stream 0, then close; Close flushes it first."""
        if body is None:
            return self._close(reason, detail)
        rid = body.request_id if isinstance(body, Error) else 0
        return [Send(body, request_id=rid, version=self.version), *self._close(reason, detail)]

    def _bad_version(self, version: int, request_id: int) -> list[Action]:
        """A logged-in peer sent a header version no side negotiated: the framing is no longer
        trusted (20.1), so ERROR{UPGRADE_REQUIRED} and a protocol close (1002), never a PONG."""
        self._fire(Event.PROTOCOL_ERROR)
        error = upgrade_required(version, self.config.server_versions, request_id)
        counted = Count("protocol_error", "UnsupportedVersion")
        return [counted, *self._final(error, CloseReason.PROTOCOL_ERROR, error.detail)]

    def _denied(
        self, detail: str, request_id: int, reason: CloseReason = CloseReason.NOT_AUTHENTICATED
    ) -> list[Action]:
        """The state machine already moved to CLOSED: say why, then close."""
        error = Error(code=int(ErrorCode.PERMISSION_DENIED), detail=detail, request_id=request_id)
        return self._final(error, reason, detail)

    def _token_gate(self, body: Body, request_id: int, now_ms: int) -> list[Action] | None:
        """None: the frame goes on. In the grace a write gets ERROR{TOKEN_EXPIRED}; past it,
        any frame ends the connection (§15.3.1)."""
        phase = self._token_phase(now_ms)
        if phase is TokenPhase.VALID or (phase is TokenPhase.GRACE and not is_write(body)):
            return None
        if phase is TokenPhase.GRACE:
            error = expired_error(request_id, "access token expired: read-only grace")
            sent = Send(error, request_id=request_id, version=self.version)
            return [Count("token_expired", "grace_write"), sent]
        self._fire(Event.TIMEOUT)
        return self._token_closed(request_id)

    def _token_closed(self, request_id: int) -> list[Action]:
        """The state machine already moved to CLOSED: ERROR{TOKEN_EXPIRED}, then close."""
        error = expired_error(request_id, "access token expired: grace over")
        counted = Count("token_expired", "closed")
        return [counted, *self._final(error, CloseReason.TOKEN_EXPIRED, error.detail)]

    def _protocol_error(self, exc: ProtocolError) -> list[Action]:
        error = exc.to_error_frame()
        if isinstance(exc, LimitExceeded):
            self._fire(Event.LIMIT_EXCEEDED)
            counted = Count("limit_exceeded")
            if self.closed:  # before AUTH_OK nothing but AUTH is acceptable
                return [counted, *self._final(error, CloseReason.NOT_AUTHENTICATED, exc.detail)]
            sent = [Send(error, request_id=exc.request_id, version=self.version)] if error else []
            return [counted, *sent]
        self._fire(Event.PROTOCOL_ERROR)
        counted = Count("protocol_error", type(exc).__name__)
        reason = (
            CloseReason.FRAME_TOO_LARGE
            if isinstance(exc, FrameTooLarge)
            else CloseReason.PROTOCOL_ERROR
        )
        return [counted, *self._final(error, reason, exc.detail)]

    def _unknown(self, frame: UnknownFrame, now_ms: int) -> list[Action]:
        rid = frame.header.request_id
        self._fire(Event.UNKNOWN)
        if self.closed:
            return self._denied("first frame must be AUTH", rid)
        self.last_active_ms = now_ms
        actions: list[Action] = [Count("unknown_opcode_dropped")]
        if rid:
            detail = f"unknown opcode 0x{frame.header.opcode:04X}"
            error = Error(code=int(ErrorCode.UPGRADE_REQUIRED), detail=detail, request_id=rid)
            actions.append(Send(error, request_id=rid, version=self.version))
        return actions

    def _ping(self, frame: Frame, ping: Ping, now_ms: int) -> list[Action]:
        self._fire(Event.PING)
        if self.closed:
            return self._denied("first frame must be AUTH", frame.header.request_id)
        self.last_active_ms = now_ms
        gated = self._token_gate(ping, frame.header.request_id, now_ms)
        if gated is not None:
            return gated
        self.last_applied_mailbox_seq = max(
            self.last_applied_mailbox_seq, ping.last_applied_mailbox_seq
        )
        last_pushed, dirty, dirty_count = self._pong_fields()
        pong = Pong(
            ping_id=ping.ping_id,
            server_time=now_ms,
            echo_client_time=ping.client_time,
            last_pushed_user_seq=last_pushed,
            mailbox_dirty=dirty,
            next_ping_interval_ms=self.config.next_ping_interval_ms,
            idle_timeout_ms=self.config.idle_timeout_ms,
        )
        counted = Count("ping_probe" if ping.probe else "ping")
        sent = Send(pong, request_id=frame.header.request_id, version=self.version)
        return [counted, *dirty_count, sent]

    def _auth(self, frame: Frame, auth: Auth, now_ms: int) -> list[Action]:
        rid = frame.header.request_id
        state = self._machine.state
        online = state in (ConnState.ONLINE, ConnState.RENEWING)
        dup = CloseReason.DUPLICATE_AUTH
        if online and self.grant is not None and auth.device_id != self.grant.device_id:
            self._fire(Event.BAD_REAUTH)
            return self._denied("re-AUTH must keep the bound device_id", rid, dup)
        if online and self._token_phase(now_ms) is TokenPhase.EXPIRED:
            self._fire(Event.TIMEOUT)  # the grace ended without renewal: too late (§15.3.1)
            return self._token_closed(rid)
        self._fire(Event.AUTH)
        if self.closed:
            return self._denied("AUTH while another AUTH is in flight", rid, dup)
        self.last_active_ms = now_ms
        self._auth_request_id = rid
        if not online:
            version = negotiate_version(frame.header.version, self.config.server_versions)
            if version is None:
                error = upgrade_required(frame.header.version, self.config.server_versions, rid)
                return self.auth_rejected(error, now_ms)
            self.version, self.capabilities = version, auth.capabilities
        problem = check_credentials(auth)
        if problem:
            error = Error(code=int(ErrorCode.PERMISSION_DENIED), detail=problem, request_id=rid)
            return self.auth_rejected(error, now_ms)
        request = auth_request(frame, auth, peer=self.peer, version=self.version, now_ms=now_ms)
        return [Authenticate(request, renewal=online, cursor=auth.mailbox_cursor)]
