"""Session-list paging (12.8): keyset over an in-memory snapshot, signed cursors, revisions.

Why keyset and a snapshot: order changes while a client pages, so offsets would skip or repeat
rows (12.8.1). The snapshot is loaded once (at most ``max_conversations_per_user`` rows) and
sorted ``(zone, pin_rank ASC, last_activity_id DESC, conversation_id ASC)``; a page is a
bisect plus ``limit`` rows. Zones: pinned, normal, then the archived partition (12.8.1, 12.9),
so one paging stream carries all three and the client splits on ``archived``.

``page_cursor`` = the last row's sort key and the snapshot revision, HMAC-signed with a key the
caller passes in and bound to ``(tenant, user)`` (INV-28). A revision that is not the current
one restarts at page 1 of the current revision (12.8.2, INV-27): a structural change (pin,
archive, membership) or a reload after ``snapshot_ttl`` bumps it.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from qim.core.session_list.config import SessionListConfig
from qim.core.session_list.rows import SessionRow, UserProjection, listed
from qim.core.session_list.state import UserConversationState
from qim.core.session_list.unread import display_unread
from qim.schemas.frames import Error, ErrorCode
from qim.schemas.frames.base import u128_to_bytes
from qim.schemas.frames.history import PullSessionList, SessionEntry, SessionListBatch

__all__ = [
    "PageCursorError",
    "SessionSnapshot",
    "SnapshotSlot",
    "load_snapshot",
    "merge_in_place",
    "page",
    "page_all",
    "refresh_slot",
    "session_entry",
    "sign_cursor",
    "sort_key",
    "verify_cursor",
]

PINNED, NORMAL, ARCHIVED = 0, 1, 2
SortKey: TypeAlias = tuple[int, int, int, str]
"""``(zone, pin_rank, -last_activity_id, conversation_id)``; ascending = list order."""

_VERSION: Final = 1
_LABEL: Final = b"qim-session-page-cursor/v1"
_HEAD: Final = struct.Struct(">BQBi16s")  # version, revision, zone, pin_rank, last_activity_id
_U16: Final = struct.Struct(">H")
_TAG: Final = 32


class PageCursorError(ValueError):
    """Not a cursor we signed for this user: answer CURSOR_INVALID (AT-36)."""


def sort_key(row: SessionRow, state: UserConversationState) -> SortKey:
    if state.archived:
        zone, pin = ARCHIVED, 0
    elif state.pin_rank is not None:
        zone, pin = PINNED, state.pin_rank
    else:
        zone, pin = NORMAL, 0
    return (zone, pin, -row.last_activity_id, row.conversation_id)


def _mac(key: bytes, tenant_id: str, user_id: str, body: bytes) -> bytes:
    subkey = hmac.new(key, _LABEL, hashlib.sha256).digest()
    bound = b"".join(_U16.pack(len(s)) + s for s in (tenant_id.encode(), user_id.encode()))
    return hmac.new(subkey, bound + body, hashlib.sha256).digest()


def sign_cursor(key: bytes, tenant_id: str, user_id: str, revision: int, at: SortKey) -> bytes:
    zone, pin, neg_activity, conversation_id = at
    conv = conversation_id.encode()
    body = _HEAD.pack(_VERSION, revision, zone, pin, u128_to_bytes(-neg_activity))
    body += _U16.pack(len(conv)) + conv
    return body + _mac(key, tenant_id, user_id, body)


def verify_cursor(key: bytes, tenant_id: str, user_id: str, token: bytes) -> tuple[int, SortKey]:
    """``(revision, sort key)`` of a cursor we signed for this user, else PageCursorError."""
    if len(token) < _HEAD.size + _U16.size + _TAG:
        raise PageCursorError("page_cursor too short")
    body, tag = token[:-_TAG], token[-_TAG:]
    if not hmac.compare_digest(tag, _mac(key, tenant_id, user_id, body)):
        raise PageCursorError("page_cursor signature mismatch")
    version, revision, zone, pin, activity = _HEAD.unpack_from(body)
    (length,) = _U16.unpack_from(body, _HEAD.size)
    conv = body[_HEAD.size + _U16.size :]
    if version != _VERSION or len(conv) != length:
        raise PageCursorError("page_cursor malformed")
    return revision, (zone, pin, -int.from_bytes(activity, "big"), conv.decode())


@dataclass(frozen=True, slots=True)
class SnapshotSlot:
    """Revision bookkeeping of one user's in-memory snapshot (12.8.2); times are the caller's
    process clock (the snapshot is process memory, never materialized)."""

    revision: int
    last_used_ms: int


def refresh_slot(
    slot: SnapshotSlot | None, now_ms: int, ttl_ms: int, *, structural_change: bool = False
) -> tuple[SnapshotSlot, bool]:
    """``(slot, reload)``: revision 1 on first load, +1 on reload after ``snapshot_ttl`` of
    inactivity (AT-40) or on a structural change; otherwise unchanged and merged in place."""
    if slot is None:
        return SnapshotSlot(1, now_ms), True
    if now_ms - slot.last_used_ms >= ttl_ms:
        return SnapshotSlot(slot.revision + 1, now_ms), True
    if structural_change:
        return SnapshotSlot(slot.revision + 1, now_ms), True
    return SnapshotSlot(slot.revision, now_ms), False


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """One revision's sorted rows: ``keys[i]`` is the sort key of ``sessions[i]``."""

    revision: int
    keys: tuple[SortKey, ...]
    sessions: tuple[SessionEntry, ...]


def session_entry(row: SessionRow, state: UserConversationState, preview: bytes) -> SessionEntry:
    """One ``sessions[]`` item; always carries ``read_conversation_seq`` (INV-29)."""
    unread, exact = display_unread(row.counts, state)
    return SessionEntry(
        conversation_id=row.conversation_id,
        latest_conversation_seq=row.latest_conversation_seq,
        last_activity_id=u128_to_bytes(row.last_activity_id),
        last_message_id=u128_to_bytes(row.last_message_id),
        preview_or_placeholder=preview,
        unread_count=unread,
        unread_exact=exact,
        mention_count=row.mention_count,
        mention_first_conversation_seq=row.mention_first_conversation_seq,
        pin_rank=state.pin_rank,
        muted=state.muted,
        archived=state.archived,
        read_conversation_seq=state.read_conversation_seq,
    )


def load_snapshot(
    projection: UserProjection,
    revision: int,
    config: SessionListConfig,
    previews: Mapping[str, bytes] | None = None,
    *,
    include_left: bool = False,
) -> SessionSnapshot:
    """Sort the user's listed rows once (capped at ``max_conversations_per_user``)."""
    previews = previews or {}
    items: list[tuple[SortKey, SessionEntry]] = []
    for conv, row in projection.rows.items():
        state = projection.state(conv)
        if listed(row, state, include_left=include_left):
            items.append((sort_key(row, state), session_entry(row, state, previews.get(conv, b""))))
    items.sort(key=lambda item: item[0])
    items = items[: config.max_conversations_per_user]
    return SessionSnapshot(revision, tuple(k for k, _ in items), tuple(s for _, s in items))


def merge_in_place(
    snapshot: SessionSnapshot,
    projection: UserProjection,
    conversation_ids: Iterable[str],
    previews: Mapping[str, bytes] | None = None,
    *,
    include_left: bool = False,
) -> SessionSnapshot:
    """Fold non-structural row changes (new activity, unread, preview) into the snapshot
    without a revision bump (12.8.2); a moved row is re-placed by its new sort key."""
    previews = previews or {}
    keys, sessions = list(snapshot.keys), list(snapshot.sessions)
    for conv in sorted(set(conversation_ids)):
        for i, entry in enumerate(sessions):
            if entry.conversation_id == conv:
                del keys[i], sessions[i]
                break
        row = projection.rows.get(conv)
        state = projection.state(conv)
        if row is None or not listed(row, state, include_left=include_left):
            continue
        key = sort_key(row, state)
        at = bisect.bisect_left(keys, key)
        keys.insert(at, key)
        sessions.insert(at, session_entry(row, state, previews.get(conv, b"")))
    return SessionSnapshot(snapshot.revision, tuple(keys), tuple(sessions))


def page(
    snapshot: SessionSnapshot,
    request: PullSessionList,
    config: SessionListConfig,
    *,
    key: bytes,
    tenant_id: str,
    user_id: str,
    projection_complete: bool = True,
) -> SessionListBatch | Error:
    """Answer PULL_SESSION_LIST from ``snapshot``; a foreign revision restarts at page 1."""
    start = 0
    if request.page_cursor:
        try:
            revision, after = verify_cursor(key, tenant_id, user_id, request.page_cursor)
        except PageCursorError as exc:
            return Error(code=int(ErrorCode.CURSOR_INVALID), detail=str(exc))
        if revision == snapshot.revision == request.snapshot_revision:
            start = bisect.bisect_right(snapshot.keys, after)
    limit = config.page_limit(request.limit)
    end = min(start + limit, len(snapshot.keys))
    has_more = end < len(snapshot.keys)
    cursor = (
        sign_cursor(key, tenant_id, user_id, snapshot.revision, snapshot.keys[end - 1])
        if has_more
        else b""
    )
    return SessionListBatch(
        sessions=snapshot.sessions[start:end],
        snapshot_revision=snapshot.revision,
        next_page_cursor=cursor,
        has_more=has_more,
        projection_complete=projection_complete,
    )


def page_all(
    snapshot: SessionSnapshot, config: SessionListConfig, *, key: bytes, tenant_id: str,
    user_id: str, limit: int = 0,
) -> Iterable[SessionListBatch]:  # fmt: skip
    """Every page of one revision in order (tests and the REBUILD first screen)."""
    request = PullSessionList(snapshot_revision=snapshot.revision, limit=limit)
    while True:
        batch = page(snapshot, request, config, key=key, tenant_id=tenant_id, user_id=user_id)
        if isinstance(batch, Error):
            raise PageCursorError(batch.detail)
        yield batch
        if not batch.has_more:
            return
        request = PullSessionList(
            snapshot_revision=snapshot.revision, page_cursor=batch.next_page_cursor, limit=limit
        )
