"""Login with offline sync: AUTH, pipelined PULL_MAILBOX, SYNC_COMPLETE -> ONLINE_READY (§9.3).

:func:`login_and_sync` drives the pure :class:`~qim.client.sync.MailboxSync` over a
:class:`~qim.client.QimClient`; the application persists ``SyncResult.cursor`` after storing
``SyncResult.entries``. Why each step:

* AUTH presents the persisted :class:`~qim.client.sync.DeviceCursor` (signed token, plaintext
  seq, §6.8). AUTH_OK's ``mailbox_cursor_token`` replaces the token: the server signs lane,
  shard and epoch in; the seq stays the client's. The returned cursor is what the next AUTH
  presents.
* Pulls: MailboxSync cuts ``(cursor, sync_to_seq]`` by seq value into at most
  ``pull_mailbox_window`` (4) sub-ranges, all in flight at once; each continues serially while
  ``has_more``, and the cursor only moves contiguously (§9.3.2, T28). ``acked_seq`` reports the
  position the application had persisted when this login began (telemetry, §9.3.2).
* SYNC_COMPLETE once every range is applied. SYNC_INCOMPLETE (the server saw a gap) re-pulls
  the session's range once, then asks again (T30).
* ONLINE_READY releases staged pushes (none are read here: the application feeds
  ``SyncResult.sync.on_push`` from :meth:`QimClient.events`). Then one top-up
  ``PULL_MAILBOX(cursor, 0)``: the gateway publishes the device's presence after snapshotting
  ``sync_to_seq``, so an event materialized in between may never be pushed (the digest's
  "login race"); the top-up closes that gap for one round trip.
* A cursor verdict - at AUTH (the gateway then closes the link) or in a pull - is adopted by
  MailboxSync (CURSOR_EXPIRED: the REBUILD re-handshake with ``(token, 0)``, §9.6.3 step 0;
  CURSOR_REBASED: the new token and ``replay_from_seq``; CURSOR_INVALID: a new device) and AUTH
  is sent again on a fresh client. SHARD_MOVED / RATE_LIMITED at AUTH back off for
  ``retry_after_ms`` and AUTH again; SHARD_MOVED on a pull (a lane catching up) retries that
  pull. All of it bounded by ``max_attempts``.
* ``SyncResult.entries`` are deduplicated by ``(message_id, event_id)`` (MailboxSync) and
  sorted by ``mailbox_seq``: sync order only - timelines order by the §6.9 keys.

After a REBUILD re-handshake ``SyncResult.rebuild_required`` is true: run the §9.6.3 back-fill
(PULL_SESSION_LIST, PULL_HISTORY per conversation), then ``SyncResult.sync.rebuild_done()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Final

import msgspec

from qim.client.client import DEFAULT_CLIENT_VERSION, QimClient
from qim.client.errors import QimError
from qim.client.retry import retry_delay_ms
from qim.client.sync import DeviceCursor, MailboxSync, SyncPhase, SyncProtocolError
from qim.schemas.frames import (
    AuthOk,
    Error,
    ErrorCode,
    MailboxBatch,
    PullMailbox,
    PushEvents,
    SyncEntry,
)

__all__ = ["SyncResult", "catch_up", "login_and_sync"]

_CURSOR_CODES: Final = frozenset(
    {ErrorCode.CURSOR_EXPIRED, ErrorCode.CURSOR_REBASED, ErrorCode.CURSOR_INVALID}
)
_BACK_OFF_CODES: Final = frozenset({ErrorCode.SHARD_MOVED, ErrorCode.RATE_LIMITED})
_DEFAULT_RETRY_MS: Final = 1_000
_MAX_RETRY_MS: Final = 30_000
_MAX_PULL_RETRIES: Final = 8


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A device that is online: what it pulled and the cursor to persist after storing it."""

    client: QimClient  # connected and past ONLINE_READY (a fresh one if AUTH was repeated)
    auth_ok: AuthOk
    entries: list[SyncEntry]
    cursor: DeviceCursor
    sync: MailboxSync  # keeps deduplicating pushes, decides fallback pulls (§6.10.1)
    attempts: int = 1

    def on_push(self, push: PushEvents, now_ms: int | None = None) -> list[SyncEntry]:
        """A PUSH_EVENTS frame's entries not seen before, by ``(message_id, event_id)``
        (11.1.1: a push may repeat a pulled entry or an earlier push)."""
        return self.sync.on_push(push, _wall_ms() if now_ms is None else now_ms)

    async def pushed(self) -> AsyncIterator[SyncEntry]:
        """Deduplicated pushed entries from ``client.events()``; other frames are skipped.
        Ends when the connection closes."""
        async for frame in self.client.events():
            if isinstance(frame.body, PushEvents):
                for entry in self.on_push(frame.body):
                    yield entry

    @property
    def session_list_required(self) -> bool:
        """AUTH_OK asked for PULL_SESSION_LIST before the list is first rendered (9.3.1:
        ``projection_complete = false``, e.g. a ``mention_only`` conversation, 10.2.3)."""
        return not self.auth_ok.projection_complete

    @property
    def rebuild_required(self) -> bool:
        """CURSOR_EXPIRED was met: the §9.6.3 back-fill is still to do."""
        return self.cursor.rebuild_pending


async def login_and_sync(
    client: QimClient,
    url: str,
    access_token: str,
    device_id: str,
    cursor: DeviceCursor | None = None,
    *,
    sync: MailboxSync | None = None,
    max_attempts: int = 4,
    top_up: bool = True,
    client_version: str = DEFAULT_CLIENT_VERSION,
    capabilities: int = 0,
    clock_ms: Callable[[], int] = _wall_ms,
    session_list: bool | None = False,
) -> SyncResult:
    """AUTH on ``client`` (an unconnected QimClient) and sync until ONLINE_READY.

    ``sync`` continues an existing MailboxSync (its cursor wins over ``cursor``; its dedup
    memory carries over), e.g. the previous :class:`SyncResult`'s after that connection
    dropped: a phase left over from it is ended first. Raises
    :class:`QimError` for a verdict that another AUTH cannot fix (or after ``max_attempts``),
    :class:`~qim.client.sync.SyncProtocolError` for a server that breaks §9.3.3; the client is
    closed then.

    ``session_list``: run PULL_SESSION_LIST (every page, into ``client.sessions``) after
    ONLINE_READY. None = when the server asks for it with ``AUTH_OK.projection_complete =
    false`` -- the mandatory step of 9.3.1, which the ``mention_only`` tier relies on (10.2.3);
    an app that renders the list passes None. False (the default, for now) leaves it to the
    caller (``SyncResult.session_list_required``): a gateway without a login sync sends the
    field's default false, and no mailbox would answer the pull (topology.md decision 46).
    """
    state = sync if sync is not None else MailboxSync(cursor)
    if state.phase is not SyncPhase.OFFLINE:
        state.disconnect()  # a reconnect: the previous connection's login is over
    entries: list[SyncEntry] = []
    for attempt in range(1, max_attempts + 1):
        last = attempt == max_attempts
        try:
            ok = await client.connect(
                url,
                access_token,
                device_id,
                client_version=client_version,
                capabilities=capabilities,
                cursor=state.auth_cursor(),
            )
        except QimError as exc:
            await _refused(state, exc, last, attempt - 1)
            client = client.fresh()
            continue
        except BaseException:
            state.disconnect()
            raise
        try:
            entries += await _synced(client, state, ok, top_up, clock_ms)
        except QimError as exc:
            await client.close()
            if exc.code not in _CURSOR_CODES or last:
                state.disconnect()
                raise
            state.on_error(_error_of(exc))  # adopt the verdict, AUTH again
            client = client.fresh()
            continue
        except BaseException:
            state.disconnect()
            await client.close()
            raise
        client.last_applied_mailbox_seq = state.cursor.last_applied_mailbox_seq
        if session_list or (session_list is None and not ok.projection_complete):
            await client.load_session_list()
        ordered = sorted(entries, key=lambda e: (e.mailbox_seq, e.event_ordinal, e.event_id))
        return SyncResult(client, ok, ordered, state.cursor, state, attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def catch_up(
    result: SyncResult,
    *,
    user_refresh: bool = False,
    clock_ms: Callable[[], int] = _wall_ms,
) -> list[SyncEntry]:
    """The online device's pull rule (6.10.1, 15.1.1): PING, then ``PULL_MAILBOX(cursor, 0)``
    iff the PONG says ``mailbox_dirty`` or ``cursor < last_pushed_user_seq`` (or the user asks),
    at most once per ``client_resync_min_interval``. Returns the entries not seen before;
    persist ``result.sync.cursor`` after storing them.

    Why a device needs it even when every push arrived: pushes never move the cursor (9.4.3),
    and an event materialized between the login's top-up and the MailboxNode learning the new
    presence is neither pulled nor pushed; the next pull closes that gap.
    """
    state = result.sync
    state.on_pong(await result.client.ping())
    pull = state.fallback_pull(clock_ms(), user_refresh=user_refresh)
    if pull is None:
        return []
    acked = state.cursor.last_applied_mailbox_seq
    got = await _drain(result.client, state, [pull], acked, clock_ms)
    result.client.last_applied_mailbox_seq = state.cursor.last_applied_mailbox_seq
    return got


async def _refused(state: MailboxSync, exc: QimError, last: bool, retry: int = 0) -> None:
    """An ERROR instead of AUTH_OK: adopt a cursor verdict or back off; raise when final."""
    if exc.code in _CURSOR_CODES:
        state.on_error(_error_of(exc))
        if last:
            raise exc
        return
    state.disconnect()
    if exc.code not in _BACK_OFF_CODES or last:
        raise exc
    await asyncio.sleep(_retry_after_s(exc, retry))


async def _synced(
    client: QimClient,
    state: MailboxSync,
    ok: AuthOk,
    top_up: bool,
    clock_ms: Callable[[], int],
) -> list[SyncEntry]:
    """From AUTH_OK to ONLINE_READY (and the top-up): the entries delivered on the way."""
    acked = state.cursor.last_applied_mailbox_seq  # what the application had persisted
    if ok.mailbox_cursor_token:
        state.cursor = replace(state.cursor, token=ok.mailbox_cursor_token)
    got = await _drain(client, state, state.on_auth_ok(ok), acked, clock_ms)
    for again in (False, True):
        complete = state.sync_complete()
        if complete is None:
            raise SyncProtocolError("login ranges still open after every pull finished")
        try:
            await client.sync_complete(complete.sync_to_seq)
            break
        except QimError as exc:
            if exc.code != ErrorCode.SYNC_INCOMPLETE or again:
                raise
            pulls = state.on_error(_error_of(exc))
            got += await _drain(client, state, pulls, acked, clock_ms)
    got += state.on_online_ready(clock_ms())
    if top_up:
        pull = state.fallback_pull(clock_ms(), user_refresh=True)
        if pull is not None:
            got += await _drain(client, state, [pull], acked, clock_ms)
    return got


async def _drain(
    client: QimClient,
    state: MailboxSync,
    first: Iterable[PullMailbox],
    acked: int,
    clock_ms: Callable[[], int],
) -> list[SyncEntry]:
    """Keep every open range's next pull in flight until all are complete (§9.3.2)."""
    got: list[SyncEntry] = []
    flying: dict[asyncio.Task[MailboxBatch], PullMailbox] = {}

    def launch(requests: Iterable[PullMailbox]) -> None:
        busy = {(r.after_seq, r.up_to_seq) for r in flying.values()}
        for request in requests:
            if (request.after_seq, request.up_to_seq) in busy:
                continue  # that range's previous pull is still out
            busy.add((request.after_seq, request.up_to_seq))
            call = client.pull_mailbox(
                request.after_seq,
                up_to_seq=request.up_to_seq,
                max_items=request.max_items,
                max_bytes=request.max_bytes,
                acked_seq=acked,
            )
            flying[asyncio.create_task(call)] = request

    launch(first)
    retries = 0
    try:
        while flying:
            done, _ = await asyncio.wait(flying, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: flying[t].after_seq):
                request = flying.pop(task)
                try:
                    batch = task.result()
                except QimError as exc:  # a lane still catching up after a takeover
                    if exc.code != ErrorCode.SHARD_MOVED or retries >= _MAX_PULL_RETRIES:
                        raise
                    await asyncio.sleep(_retry_after_s(exc, retries))
                    retries += 1
                    launch([request])
                    continue
                got += state.on_batch(request, batch, clock_ms())
            launch(state.next_requests())
    finally:
        for task in flying:
            task.cancel()
        await asyncio.gather(*flying, return_exceptions=True)
    return got


def _error_of(exc: QimError) -> Error:
    """The ERROR body back from the exception (MailboxSync reads its extras)."""
    fields = {k: v for k, v in exc.extras.items() if k in Error.__struct_fields__}
    fields.update(code=int(exc.code), detail=exc.detail, request_id=exc.request_id)
    return msgspec.convert(fields, Error)


def _retry_after_s(exc: QimError, retry: int) -> float:
    """The wait before ``retry`` (0-based) of a backed-off AUTH or pull: the server's
    ``retry_after_ms``, never earlier, jittered and growing (:mod:`qim.client.retry`)."""
    ms = retry_delay_ms(exc, retry)
    return min(ms if ms is not None else _DEFAULT_RETRY_MS, _MAX_RETRY_MS) / 1000
