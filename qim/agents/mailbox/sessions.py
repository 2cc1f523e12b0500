"""The MailboxNode's session-list shell: PULL_SESSION_LIST pages and user-state appends.

Why a snapshot per user in process memory (12.8.2): keyset paging over a list that reorders
while the client pages needs one frozen order per ``snapshot_revision``. A first page (no
cursor), a foreign revision or a snapshot idle past ``snapshot_ttl`` loads a new one from the
stored projection; its revision is bumped when its content differs from the one held, so a
client paging a revision that is gone restarts at page 1 (``paging.page``). The snapshot is
never materialized; the page cursor is HMAC-signed with the cursor key ring's active key.

User-state requests (MARK_READ ...) are never applied here: :func:`command_of` turns one into
the ``UserStateCommand`` that the node appends to the user's shard partition of the dispatch
log, and the fold materializes it from there (direction.md 3).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer

from qim.agents.keyring import BodyKeys
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.read_diffusion import ONLINE_ACTION, heads_of
from qim.core.mailbox.session_store import (
    load_header,
    load_projection,
    load_states,
    shown_preview,
)
from qim.core.session_list import (
    SessionListConfig,
    SessionSnapshot,
    UserBadgeState,
    load_snapshot,
    page,
)
from qim.core.session_list.read_diffusion import mark_entries, overlay
from qim.schemas.frames import Error
from qim.schemas.frames.history import SessionListBatch
from qim.schemas.records.dispatch import encode_dispatch_record
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullSessionListRequest,
    UserStateRequest,
    decode_user_request,
)
from qim.schemas.records.user_state import USER_STATE_ACTIONS, UserStateCommand, command_id

__all__ = [
    "ReadMerge",
    "SessionSnapshots",
    "badge_of_user",
    "command_of",
    "online_commands",
    "projection_complete",
    "send_commands",
    "session_list_page",
    "user_state_commands",
]

log = logging.getLogger(__name__)

_MAX_HELD = 10_000


@dataclass
class _Held:
    snapshot: SessionSnapshot
    used_ms: int
    stale: bool = False


@dataclass
class SessionSnapshots:
    """Each user's current snapshot (process memory, lost on restart: revisions restart)."""

    held: dict[tuple[str, str], _Held] = field(default_factory=dict)
    bodies: BodyKeys | None = None
    """The SESSION_LIST_BATCH preview fill's keys (21.3.4); snapshots hold plaintext previews
    in process memory only."""

    def current(
        self,
        store: KVReader,
        tenant_id: str,
        user_id: str,
        request: PullSessionListRequest,
        config: SessionListConfig,
        now_ms: int,
    ) -> SessionSnapshot:
        key = (tenant_id, user_id)
        held = self.held.get(key)
        fresh = held is not None and now_ms - held.used_ms < config.snapshot_ttl_ms
        message = request.message
        if (
            held is not None
            and fresh
            and not held.stale
            and message.page_cursor
            and message.snapshot_revision == held.snapshot.revision
        ):
            held.used_ms = now_ms
            return held.snapshot
        projection = load_projection(store, tenant_id, user_id)
        heads = heads_of(store, tenant_id, projection.states)  # 10.2.3: the head join
        projection = overlay(projection, heads)
        previews = {
            conv: shown_preview(
                store, tenant_id, conv, row.latest_conversation_seq, projection.state(conv)
            )
            for conv, row in projection.rows.items()
        }
        if self.bodies is not None:
            bodies = self.bodies
            previews = {c: bodies.open_preview(p, tenant_id, c) for c, p in previews.items()}
        revision = 1 if held is None else held.snapshot.revision
        snapshot = load_snapshot(projection, revision, config, previews)
        if heads:
            sessions = mark_entries(snapshot.sessions, heads)
            snapshot = SessionSnapshot(snapshot.revision, snapshot.keys, sessions)
        if held is not None and (held.stale or snapshot.sessions != held.snapshot.sessions):
            snapshot = SessionSnapshot(revision + 1, snapshot.keys, snapshot.sessions)
        if len(self.held) >= _MAX_HELD:
            self._prune(now_ms, config.snapshot_ttl_ms)
        self.held[key] = _Held(snapshot, now_ms)
        return snapshot

    def invalidate(self, tenant_id: str, user_id: str) -> None:
        """A structural change (pin, archive, membership) was folded: the next page of the
        held revision restarts at page 1 of a new one (12.8.2)."""
        held = self.held.get((tenant_id, user_id))
        if held is not None:
            held.stale = True

    def _prune(self, now_ms: int, ttl_ms: int) -> None:
        for key in [k for k, h in self.held.items() if now_ms - h.used_ms >= ttl_ms]:
            del self.held[key]
        while len(self.held) >= _MAX_HELD:
            del self.held[next(iter(self.held))]


def session_list_page(
    store: KVReader,
    request: PullSessionListRequest,
    config: SessionListConfig,
    *,
    cursor_key: bytes,
    snapshots: SessionSnapshots,
    now_ms: int,
) -> SessionListBatch | Error:
    """SESSION_LIST_BATCH for one PULL_SESSION_LIST (12.8), or CURSOR_INVALID."""
    tenant, user = request.tenant_id, request.user_id
    snapshot = snapshots.current(store, tenant, user, request, config, now_ms)
    return page(
        snapshot,
        request.message,
        config,
        key=cursor_key,
        tenant_id=tenant,
        user_id=user,
        projection_complete=True,
    )


def badge_of_user(store: KVReader, tenant_id: str, user_id: str) -> UserBadgeState:
    """The AUTH_OK badge fields (7.7): the stored badge, versioned by its mailbox_seq."""
    return load_header(store, tenant_id, user_id).badge


def projection_complete(store: KVReader, tenant_id: str, user_id: str) -> bool:
    """AUTH_OK ``projection_complete``: false while the user is an active member of a
    ``mention_only`` conversation. Its projection row lacks the silent-period head, which only
    PULL_SESSION_LIST joins, so the list is indeed incomplete without that step; the flag is
    the "existing field" 9.3.1 names to make PULL_SESSION_LIST a mandatory login step
    (10.2.3; AUTH_OK gains no field, I-33)."""
    states = load_states(store, tenant_id, user_id)
    active = [conv for conv, state in states.items() if state.active]
    return not heads_of(store, tenant_id, active)


def command_of(
    request: UserStateRequest, shard: int, now_ms: int, *, offset: int | None = None
) -> UserStateCommand | None:
    """The dispatch-log record for one user-state request; None for an unknown action.

    ``offset`` is the request's position in its user-requests partition: MARK_READ and
    CONVERSATION_STATE travel with request_id 0, so without it every command of one session
    would share one ``command_id`` (and one CONTROL ``event_id``, which devices deduplicate
    on). A redelivered record keeps its offset, hence its identity.
    """
    if request.action not in USER_STATE_ACTIONS or not request.conversation_id:
        return None
    salt = request.correlation_id if offset is None else f"{request.correlation_id}@{offset}"
    return UserStateCommand(
        tenant_id=request.tenant_id,
        user_id=request.user_id,
        conversation_id=request.conversation_id,
        action=request.action,
        command_id=command_id(
            request.tenant_id,
            request.user_id,
            request.device_id,
            request.session_epoch,
            request.request_id,
            salt,
        ),
        target_mailbox_shard=shard,
        committed_at=now_ms,
        origin_device_id=request.device_id,
        read_conversation_seq=request.read_conversation_seq,
        flag=request.flag,
        pin_rank=request.pin_rank,
        notification_policy=request.notification_policy,
    )


def user_state_commands(
    records: Iterable[Any], partition: int, now_ms: int
) -> list[UserStateCommand]:
    """The commands of one fetched user-requests run, MARK_READs merged per conversation
    (the highest watermark wins: ``read_sync_merge_window`` within one fetch)."""
    out: list[UserStateCommand] = []
    read_at: dict[tuple[str, str, str], int] = {}
    for record in records:
        try:
            request = decode_user_request(record.value)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
            continue
        if not isinstance(request, UserStateRequest):
            continue
        command = command_of(request, partition, now_ms, offset=record.offset)
        if command is None:
            continue
        if command.action == "mark_read":
            key = (command.tenant_id, command.user_id, command.conversation_id)
            at = read_at.get(key)
            if at is not None:
                if command.read_conversation_seq > out[at].read_conversation_seq:
                    out[at] = command
                continue
            read_at[key] = len(out)
        out.append(command)
    return out


async def send_commands(
    producer: AIOKafkaProducer, topic: str, commands: Sequence[UserStateCommand]
) -> int:
    """Append to each command's shard partition and wait for the acks; returns the failures
    (logged: a lost command costs the client a retry, never state)."""
    sends = []
    for c in commands:
        try:
            sends.append(
                await producer.send(
                    topic, encode_dispatch_record(c), key=c.key, partition=c.partition
                )
            )
        except Exception:
            log.exception("user-state command for %s not sent", c.user_id)
    failed = len(commands) - len(sends)
    for outcome in await asyncio.gather(*sends, return_exceptions=True):
        if isinstance(outcome, BaseException):
            failed += 1
            log.warning("user-state command not acknowledged: %s", outcome)
    return failed


@dataclass
class ReadMerge:
    """``read_sync_merge_window`` (9.7.2, 3 s): MARK_READs are held per (user, conversation)
    and only the highest is appended when the window that the first one opened ends, so a
    reader scrolling through a conversation writes one CONTROL entry, not one per message.

    Any other command of the same user first releases that user's held reads, so the log
    keeps the user's order (a mark unread after a read must not be overtaken by it). Held
    reads live in process memory: a crash within the window loses them (the device marks
    again on its next read; the watermark is forward only, so nothing goes backwards)."""

    window_ms: int
    held: dict[tuple[str, str, str], tuple[int, UserStateCommand]] = field(default_factory=dict)

    def add(self, commands: Sequence[UserStateCommand], now_ms: int) -> list[UserStateCommand]:
        """Hold the reads; returns what is to be appended now, in order."""
        out: list[UserStateCommand] = []
        for c in commands:
            if c.action == "mark_read" and self.window_ms > 0:
                key = (c.tenant_id, c.user_id, c.conversation_id)
                held = self.held.get(key)
                if held is None:
                    self.held[key] = (now_ms, c)
                elif c.read_conversation_seq > held[1].read_conversation_seq:
                    self.held[key] = (held[0], c)
                continue
            user = (c.tenant_id, c.user_id)
            out += self._release([k for k in self.held if k[:2] == user])
            out.append(c)
        return out

    def due(self, now_ms: int) -> list[UserStateCommand]:
        """The reads whose window has ended."""
        ended = self.window_ms
        return self._release([k for k, (at, _) in self.held.items() if at + ended <= now_ms])

    def all(self) -> list[UserStateCommand]:
        return self._release(list(self.held))

    def _release(self, keys: list[tuple[str, str, str]]) -> list[UserStateCommand]:
        return [self.held.pop(k)[1] for k in keys]


def online_commands(replies: Iterable[MailboxReply], now_ms: int) -> list[UserStateCommand]:
    """One ``online`` command per AUTH answered ``projection_complete = false``: the user came
    online while a member of a ``mention_only`` conversation, which makes it active on its
    shard from the next message on (10.2.3, AT-42). Other logins append nothing."""
    out = []
    for reply in replies:
        auth = reply.auth_sync
        if auth is None or auth.projection_complete:
            continue
        out.append(
            UserStateCommand(
                tenant_id=reply.tenant_id,
                user_id=reply.user_id,
                conversation_id="",
                action=ONLINE_ACTION,
                command_id=command_id(
                    reply.tenant_id,
                    reply.user_id,
                    reply.device_id,
                    reply.session_epoch,
                    reply.request_id,
                    ONLINE_ACTION,
                ),
                target_mailbox_shard=reply.mailbox_shard,
                committed_at=now_ms,
                origin_device_id=reply.device_id,
            )
        )
    return out
