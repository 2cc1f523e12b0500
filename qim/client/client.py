# ruff: noqa: ASYNC109  # timeout= is the reply deadline of one request (the documented API):
# it raises RequestTimeout naming the frame and request_id, which asyncio.timeout cannot.
"""``QimClient``: AUTH (following one REDIRECT), requests by request_id, pushes, heartbeats.

One client is one logical connection (state table in :mod:`qim.client.state`); after it
closes, make a new one. Three tasks touch it: the caller's, a reader that decodes frames and
routes them (a reply to its request's future, anything server-initiated to the event queue),
and the heartbeat. Whatever ends the connection - ``close()``, EOF, a bad frame, a dead
heartbeat - fails every pending request with :class:`ConnectionClosedError` at once, so no
call hangs on a connection that is gone.

The event queue is unbounded: replies never wait behind unread pushes, so the application
must consume :meth:`QimClient.events` (or :meth:`QimClient.next_event`). The typed calls
per request frame (send_message, pull_mailbox, ...) live in :mod:`qim.client.calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Final, TypeVar

import qim
from qim.client.auth import encode_auth
from qim.client.calls import FrameCalls
from qim.client.correlate import RequestTable, stamp_request_id
from qim.client.dial import Dialer, open_transport, resolve_hint
from qim.client.errors import (
    ConnectionClosedError,
    IllegalTransition,
    QimClientError,
    QimError,
    RequestTimeout,
    TransportClosed,
    UnexpectedFrame,
)
from qim.client.framing import FramedConnection
from qim.client.gaps import HistoryCoverage
from qim.client.heartbeat import HeartbeatConfig, HeartbeatState
from qim.client.identity import identity_from_token
from qim.client.reactions import ReactionState
from qim.client.realtime import RealtimeCalls, TypingIndicators
from qim.client.refresh import TokenRefresher
from qim.client.rooms import RoomCalls, RoomTracker
from qim.client.sessions import SessionList
from qim.client.state import ClientEvent, ClientState, ClientStateMachine
from qim.client.transport import Transport
from qim.client.user_state import UserStateCalls
from qim.schemas.frames import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    Auth,
    AuthOk,
    Body,
    Error,
    ErrorCode,
    Frame,
    Kicked,
    Limits,
    MailboxCursor,
    Ping,
    Pong,
    ProtocolError,
    ReactionUpdate,
    Redirect,
    Role,
    UnknownFrame,
    spec_for_model,
)
from qim.schemas.frames.control import PresenceEntry, PresenceSub, PresenceSubDown

__all__ = ["DEFAULT_CLIENT_VERSION", "QimClient"]

log = logging.getLogger(__name__)

DEFAULT_CLIENT_VERSION: Final = f"qim-py/{qim.__version__}"
_AUTH_REQUEST_ID: Final = 1  # AUTH is a request too (A.1); its verdict is read before anything
R = TypeVar("R", bound=Body)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class QimClient(FrameCalls, UserStateCalls, RoomCalls, RealtimeCalls):
    """An async client of one ConnectionNode connection.

    ``dial`` opens a transport for a URL (default: :func:`~qim.client.dial.open_transport`,
    which uses ``ssl_context`` / ``server_hostname`` for ``wss`` and ``qim+tls``).
    ``clock_ms`` is the wall clock in epoch ms (PING.client_time), injectable for tests.
    """

    def __init__(
        self,
        *,
        dial: Dialer | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        heartbeat: HeartbeatConfig | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 10.0,
        limits: Limits = DEFAULT_LIMITS,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self._options: dict[str, Any] = {
            "dial": dial,
            "ssl_context": ssl_context,
            "server_hostname": server_hostname,
            "heartbeat": heartbeat,
            "connect_timeout": connect_timeout,
            "request_timeout": request_timeout,
            "limits": limits,
            "clock_ms": clock_ms,
        }
        self.refresher: TokenRefresher | None = None
        """Set it to renew silently on TOKEN_EXPIRED (15.3.1, ``qim.client.refresh``)."""
        self._dial = dial
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname
        self._heartbeat_config = heartbeat or HeartbeatConfig()
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._limits = limits
        self._clock_ms = clock_ms
        self._fsm = ClientStateMachine()
        self._conn: FramedConnection | None = None
        self._requests: RequestTable[asyncio.Future[Frame]] = RequestTable()
        self._events: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._close_reason = "not connected"
        self._next_ping_id = 1
        self.url: str | None = None
        self.auth_ok: AuthOk | None = None
        self.protocol_version = PROTOCOL_VERSION  # Ve from AUTH_OK's header
        self.heartbeat = HeartbeatState()
        self.kicked: Kicked | None = None
        self.last_error: QimError | None = None  # last connection-level ERROR (request_id 0)
        self.typing_indicators = TypingIndicators()
        self.presence: dict[str, PresenceEntry] = {}
        self._notified: dict[int, None] = {}  # request_ids of notify(): their ERROR is an event
        self.last_applied_mailbox_seq = 0  # the application's cursor, reported in PING
        self._bound: tuple[str, str, int] = ("", DEFAULT_CLIENT_VERSION, 0)  # for reauth
        self.sessions = SessionList()
        self.coverage = HistoryCoverage()
        self.reactions = ReactionState()
        self.rooms = RoomTracker()  # joined rooms of this connection (14.5)
        self.unknown_frames = 0  # skipped per §27.1.2
        self.late_replies = 0  # replies to requests that had already timed out

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._fsm.state

    @property
    def redirects(self) -> int:
        """REDIRECTs followed on this connection (at most 1, §5.3.2)."""
        return self._fsm.redirects

    def fresh(self) -> QimClient:
        """A new, unconnected client with this one's options and identity.

        One client is one connection; a login that has to AUTH again on a new connection (a
        cursor verdict, SHARD_MOVED, see :mod:`qim.client.login`) continues with one of these.
        """
        clone = QimClient(**self._options)
        clone.identity = self.identity
        return clone

    async def __aenter__(self) -> QimClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- connect ---------------------------------------------------------------------------

    async def connect(
        self,
        url: str,
        access_token: str,
        device_id: str,
        *,
        client_version: str = DEFAULT_CLIENT_VERSION,
        capabilities: int = 0,
        cursor: MailboxCursor | None = None,
        route_token: bytes = b"",
    ) -> AuthOk:
        """Open ``url``, AUTH, follow at most one REDIRECT, and return AUTH_OK.

        Sets :attr:`identity` from a qim access token unless the application already did
        (:mod:`qim.client.identity`; used by :meth:`send_direct`).

        Raises :class:`QimError` for an ERROR verdict (e.g. SHARD_MOVED with
        ``retry_after_ms`` after a redirect that missed again), :class:`TooManyRedirects`
        for a second REDIRECT, :class:`RequestTimeout` past ``connect_timeout``. The client
        is CLOSED after any failure. ``route_token`` presents a token held from an earlier
        REDIRECT (§15.2.1 fast reconnect).
        """
        self._fsm.fire(ClientEvent.DIAL)
        try:
            async with asyncio.timeout(self._connect_timeout):
                auth_ok = await self._handshake(
                    url,
                    route_token,
                    access_token=access_token,
                    device_id=device_id,
                    client_version=client_version,
                    capabilities=int(capabilities),
                    mailbox_cursor=cursor,
                )
        except TimeoutError:
            await self._shutdown("no AUTH verdict in time")
            raise RequestTimeout("AUTH", _AUTH_REQUEST_ID, self._connect_timeout) from None
        except BaseException as exc:
            await self._shutdown(f"connect failed: {exc!r}")
            raise
        if self.identity is None:
            self.identity = identity_from_token(access_token)
        self._bound = (device_id, client_version, int(capabilities))
        self._reader = asyncio.create_task(self._read_loop(), name="qim-client-reader")
        if self._heartbeat_config.enabled:
            self._pinger = asyncio.create_task(self._ping_loop(), name="qim-client-heartbeat")
        return auth_ok

    async def _handshake(
        self,
        url: str,
        route_token: bytes,
        *,
        access_token: str,
        device_id: str,
        client_version: str,
        capabilities: int,
        mailbox_cursor: MailboxCursor | None,
    ) -> AuthOk:
        while True:
            self.url = url
            transport = await self._open(url)
            self._conn = conn = FramedConnection(transport, Role.CLIENT, limits=self._limits)
            self._fsm.fire(ClientEvent.OPENED)
            await conn.send_raw(
                encode_auth(
                    access_token=access_token,
                    device_id=device_id,
                    client_version=client_version,
                    capabilities=capabilities,
                    mailbox_cursor=mailbox_cursor,
                    route_token=route_token,
                    request_id=_AUTH_REQUEST_ID,
                )
            )
            frame = await self._auth_verdict(conn)
            body = frame.body
            if isinstance(body, AuthOk):
                self._fsm.fire(ClientEvent.AUTH_OK)
                self.auth_ok = body
                self.protocol_version = frame.header.version
                self.heartbeat.on_auth_ok(body)
                return body
            await conn.close()
            if isinstance(body, Error):
                raise QimError.from_frame(body, request_id=frame.header.request_id)
            assert isinstance(body, Redirect)
            self._fsm.fire(ClientEvent.REDIRECT)  # raises TooManyRedirects on the second one
            url, route_token = resolve_hint(url, body.endpoint_hint), body.route_token
            self._fsm.fire(ClientEvent.DIAL)

    async def _open(self, url: str) -> Transport:
        if self._dial is not None:
            return await self._dial(url)
        return await open_transport(
            url,
            ssl_context=self._ssl_context,
            server_hostname=self._server_hostname,
            open_timeout=self._connect_timeout,
        )

    async def _auth_verdict(self, conn: FramedConnection) -> Frame:
        """The AUTH_OK, REDIRECT or ERROR answering AUTH; anything else is a server bug."""
        while True:
            try:
                frame = await conn.recv()
            except TransportClosed:
                raise ConnectionClosedError(
                    "the server closed the connection during AUTH"
                ) from None
            except ProtocolError as exc:
                raise UnexpectedFrame(f"bad frame during AUTH: {exc}") from exc
            if isinstance(frame, UnknownFrame):
                self.unknown_frames += 1
                continue
            if isinstance(frame.body, AuthOk | Redirect | Error):
                return frame
            raise UnexpectedFrame(f"{frame.name} before AUTH_OK")

    # -- requests ---------------------------------------------------------------------------

    async def request(
        self, body: Body, *, timeout: float | None = None, stream_id: int | None = None
    ) -> Frame:
        """Send ``body`` and return the reply; with a :attr:`refresher`, an
        ``ERROR{TOKEN_EXPIRED}`` renews the session silently and the request goes out once more
        (15.3.1). Otherwise as :meth:`request_once`."""
        try:
            return await self.request_once(body, timeout=timeout, stream_id=stream_id)
        except QimError as exc:
            if (
                self.refresher is None
                or isinstance(body, Auth)
                or exc.code != int(ErrorCode.TOKEN_EXPIRED)
            ):
                raise
        await self.reauth(await self.refresher.refresh(), timeout=timeout)
        return await self.request_once(body, timeout=timeout, stream_id=stream_id)

    async def request_once(
        self, body: Body, *, timeout: float | None = None, stream_id: int | None = None
    ) -> Frame:
        """Send ``body`` with a fresh request_id and return the reply frame.

        Raises :class:`QimError` when the server answers ERROR, :class:`RequestTimeout` after
        ``timeout`` (default ``request_timeout``), :class:`ConnectionClosedError` when the
        connection ends first, :class:`UnexpectedFrame` for a reply of the wrong type.
        """
        self._require_open()
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        request_id = self._requests.open(body, future)
        wait = self._request_timeout if timeout is None else timeout
        try:
            await self._send(stamp_request_id(body, request_id), request_id, stream_id)
            try:
                async with asyncio.timeout(wait):
                    return await future
            except TimeoutError:
                name = spec_for_model(type(body)).name
                raise RequestTimeout(name, request_id, wait) from None
        finally:
            self._requests.discard(request_id, future)
            if future.done() and not future.cancelled():
                future.exception()  # it may have failed while we were still sending: retrieved

    async def reauth(
        self,
        access_token: str,
        *,
        cursor: MailboxCursor | None = None,
        timeout: float | None = None,
    ) -> AuthOk:
        """Silent renewal (§15.3.1): AUTH with a new ``access_token`` on this connection.

        The device_id, client_version and capabilities are the ones bound at :meth:`connect`.
        AUTH_OK keeps the session_epoch and only confirms renewal: nothing local is cleared.
        The answer to ERROR{TOKEN_EXPIRED} (A.6 REFRESH_TOKEN_RECONNECT) before the
        ``token_expiry_grace`` ends; raises :class:`QimError` (e.g. TOKEN_EXPIRED for a stale
        token; the server then closes the connection).
        """
        device_id, client_version, capabilities = self._bound
        body = Auth(
            access_token=access_token,
            device_id=device_id,
            client_version=client_version,
            capabilities=capabilities,
            mailbox_cursor=cursor,
        )
        frame = await self.request_once(body, timeout=timeout)
        assert isinstance(frame.body, AuthOk)  # request() checked the reply type
        return frame.body

    def applied(self, mailbox_seq: int) -> None:
        """The application stored the device's mailbox up to ``mailbox_seq``: PING reports
        it, and session deltas held for it are applied (12.6.4)."""
        self.last_applied_mailbox_seq = max(self.last_applied_mailbox_seq, mailbox_seq)
        self.sessions.caught_up(self.last_applied_mailbox_seq)

    async def send(self, body: Body, *, stream_id: int | None = None) -> None:
        """Send a frame that has no reply (MARK_READ, TYPING, ...) with request_id 0."""
        self._require_open()
        await self._send(body, 0, stream_id)

    async def notify(self, body: Body) -> int:
        """Send a request that has no reply on success (TYPING, RTC_SIGNAL) with a fresh
        request_id, and return it: an answer carrying it (a refusal, also in ``last_error``;
        RTC's ``cancel{reason=offline}``) arrives as an event, not as a late reply."""
        placeholder: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        request_id = self._requests.open(body, placeholder)  # a fresh id, never in flight
        self._requests.discard(request_id, placeholder)
        self._notified[request_id] = None
        while len(self._notified) > 1024:
            del self._notified[next(iter(self._notified))]
        await self._send(stamp_request_id(body, request_id), request_id, None)
        return request_id

    async def _call_presence(self, body: PresenceSub, timeout: float | None) -> PresenceSubDown:
        return await self._call(body, PresenceSubDown, timeout)

    async def _call(self, body: Body, reply: type[R], timeout: float | None) -> R:  # FrameCalls
        frame = await self.request(body, timeout=timeout)
        if not isinstance(frame.body, reply):  # request() checked it already; for the types
            raise UnexpectedFrame(f"{frame.name} is not {reply.__name__}")
        return frame.body

    async def ping(self, *, probe: bool = False, timeout: float | None = None) -> Pong:
        """PING (A.3 #12) -> PONG; also updates :attr:`heartbeat`."""
        ping_id, self._next_ping_id = self._next_ping_id, self._next_ping_id + 1
        body = Ping(
            ping_id=ping_id,
            client_time=self._clock_ms(),
            last_applied_mailbox_seq=self.last_applied_mailbox_seq,
            network_type=self._heartbeat_config.network_type,
            probe=probe,
        )
        return await self._call(body, Pong, timeout)

    # -- server-initiated frames ------------------------------------------------------------

    async def events(self) -> AsyncIterator[Frame]:
        """Server-initiated frames (PUSH_EVENTS, KICKED, SESSION_DELTA, ERROR, ...) in order.

        Ends once the connection is closed and every queued frame has been yielded.
        """
        while True:
            item = await self._events.get()
            if item is None:
                self._events.put_nowait(None)  # later readers see the end too
                return
            yield item

    async def next_event(self, timeout: float | None = None) -> Frame:
        """The next server-initiated frame; ConnectionClosedError once closed and drained."""
        async with asyncio.timeout(timeout):
            item = await self._events.get()
        if item is None:
            self._events.put_nowait(None)
            raise self._closed_error()
        return item

    # -- close ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionClosedError. Idempotent."""
        await self._shutdown("closed by the client")

    # -- internals --------------------------------------------------------------------------

    def _require_open(self) -> FramedConnection:
        if self._fsm.state is ClientState.CLOSED:
            raise self._closed_error()
        if self._fsm.state is not ClientState.AUTHENTICATED or self._conn is None:
            raise IllegalTransition(f"requests need an AUTHENTICATED client, not {self.state.name}")
        return self._conn

    def _closed_error(self) -> ConnectionClosedError:
        return ConnectionClosedError(self._close_reason, kicked=self.kicked, error=self.last_error)

    async def _send(self, body: Body, request_id: int, stream_id: int | None) -> None:
        conn = self._require_open()
        try:
            async with self._send_lock:
                await conn.send(
                    body,
                    request_id=request_id,
                    stream_id=stream_id,
                    version=self.protocol_version,
                )
        except TransportClosed as exc:
            await self._shutdown(f"send failed: {exc}")
            raise self._closed_error() from None

    async def _read_loop(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while True:
                self._dispatch(await conn.recv())
        except TransportClosed:
            reason = "the server closed the connection"
        except ProtocolError as exc:
            reason = f"bad frame from the server: {exc!r}"
        except Exception as exc:  # a bug of ours: end the connection loudly, never hang callers
            log.exception("qim client reader failed")
            reason = f"client reader failed: {exc!r}"
        await self._shutdown(reason)

    def _dispatch(self, frame: Frame | UnknownFrame) -> None:
        if isinstance(frame, UnknownFrame):
            self.unknown_frames += 1
            return
        body = frame.body
        if isinstance(body, Pong):
            self.heartbeat.on_pong(body, self._clock_ms())
        match = self._requests.match(frame)
        if match is not None:
            future = match.waiter
            if future.done():
                return
            if isinstance(body, Error):
                future.set_exception(QimError.from_frame(body, request_id=match.request_id))
            elif not match.expects(body):
                future.set_exception(
                    UnexpectedFrame(f"{frame.name} is no reply to {match.frame_name}")
                )
            else:
                future.set_result(frame)
            return
        notified = frame.header.request_id in self._notified  # a refusal, or RTC "offline"
        if frame.header.request_id != 0 and not notified:
            self.late_replies += 1
            return
        if isinstance(body, Kicked):
            self.kicked = body
        elif isinstance(body, Error):
            self.last_error = QimError.from_frame(body)
        elif isinstance(body, ReactionUpdate):
            self.reactions.apply(body)  # newer versions only (13.6.2)
        else:  # SESSION_DELTA, BADGE_UPDATE, READ_SYNC keep the local list (12.6.2)
            self.sessions.on_frame(body, self.last_applied_mailbox_seq)
            self._realtime_frame(body, self._clock_ms())
        self._events.put_nowait(frame)

    async def _ping_loop(self) -> None:
        config = self._heartbeat_config
        while True:
            interval = config.interval_s
            if interval is None:
                interval = self.heartbeat.next_ping_interval_ms / 1000
            await asyncio.sleep(interval)
            try:
                try:
                    await self.ping(timeout=config.pong_timeout_s)
                except RequestTimeout:  # §15.1.2: one probe, then the link is dead
                    await self.ping(probe=True, timeout=config.pong_timeout_s)
            except RequestTimeout:
                await self._shutdown("no PONG to PING nor to the probe PING")
                return
            except (ConnectionClosedError, IllegalTransition):
                return  # the connection ended meanwhile
            except QimClientError as exc:  # ERROR or a wrong reply: the link itself is alive
                log.warning("qim heartbeat: %s", exc)

    async def _shutdown(self, reason: str) -> None:
        if self._fsm.state is ClientState.CLOSED:
            return
        self._fsm.fire(ClientEvent.CLOSE)
        self._close_reason = reason
        for future in self._requests.drain():
            if not future.done():
                future.set_exception(self._closed_error())
        self._events.put_nowait(None)
        current = asyncio.current_task()
        tasks = [t for t in (self._reader, self._pinger) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        await asyncio.gather(*tasks, return_exceptions=True)
