"""The MailboxNode's read path: a user request in, one :class:`MailboxReply` out.

Why a thin layer: the rules are the sync core's (``check_auth_cursor`` for the login, 9.3.1;
``pull_mailbox`` for PULL_MAILBOX, 9.3.3). What is wired here is where their inputs come from on
a MailboxNode:

* ``W[lane]`` is :meth:`OwnedShard.served_watermark`: None means the lane is still below the
  floor after a takeover (or the shard is not owned here) and the answer is
  ``SHARD_MOVED{retry_after_ms}`` -- never a batch with a watermark that is not caught up
  (10.4.2 (3), I-15);
* ``effective_trim`` and the entries come from the shard's committed store
  (``StoreMailboxReader`` over a per-request :class:`StorageProbe`, which counts the reads for
  the 26.0 observation points); bodies are joined per event group *before* the batch cutter sizes
  it, so the frame budget counts the bytes that are actually sent;
* the epoch boundary (CURSOR_REBASED) is not resolvable yet: an older-epoch cursor gets
  CURSOR_EXPIRED and rebuilds, which is always safe (5.5.3 answer 2). The EpochBoundary table
  arrives with the first epoch change procedure.

Pure apart from the store reads and ``now_ms`` (the cursor's ``issued_at``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from qim.agents.keyring import BodyKeys, opened_entry
from qim.agents.mailbox.observe import ReadStats, StorageProbe
from qim.agents.mailbox.sessions import (
    SessionSnapshots,
    badge_of_user,
    projection_complete,
    session_list_page,
)
from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import StoreMailboxReader, join_bodies
from qim.core.mailbox.keys import count_key
from qim.core.mailbox.values import decode_u64
from qim.core.sync import (
    AuthSync,
    CursorIdentity,
    CursorKeyRing,
    PendingSummary,
    PullLimits,
    check_auth_cursor,
    pull_mailbox,
    shard_moved,
)
from qim.core.sync.paging import Group
from qim.schemas.frames import Error, MailboxBatch, encode_body
from qim.schemas.frames.history import SessionListBatch
from qim.schemas.records.user_requests import (
    AuthSyncResult,
    MailboxReply,
    PullMailboxRequest,
    PullSessionListRequest,
    SyncAuthRequest,
)
from qim.schemas.routing import lane_id

__all__ = ["HINT_SCAN_CAP", "ReadContext", "ReadStats", "answer"]

HINT_SCAN_CAP: Final = 1000
"""Entries the login reads to size the pending hints; beyond it the counts are extrapolated
from the user's live entry count (the hints are estimates, B.3 pending_hint_error_ratio)."""

Reply = AuthSyncResult | MailboxBatch | SessionListBatch | Error
ReadRequest = SyncAuthRequest | PullMailboxRequest | PullSessionListRequest


@dataclass(frozen=True)
class ReadContext:
    """What every answer needs besides the shard."""

    keys: CursorKeyRing
    limits: PullLimits
    retry_after_ms: int
    now_ms: Callable[[], int]
    tombstone_probe: bool = True
    """Take ``tombstones_scanned`` from the store's statistics (when it keeps them)."""
    snapshots: SessionSnapshots = field(default_factory=SessionSnapshots)
    """PULL_SESSION_LIST's per-user snapshots (process memory, 12.8.2)."""
    bodies: BodyKeys | None = None
    """The decrypt point's keys (21.3.4): sealed bodies are opened after the join."""


def answer(
    shard: OwnedShard | None,
    partition: int,
    request: ReadRequest,
    ctx: ReadContext,
    stats: ReadStats | None = None,
) -> MailboxReply:
    """The reply to one request that arrived on user-requests partition ``partition``;
    ``stats`` receives what it read from the store (the 26.0 observation points)."""
    stats = ReadStats() if stats is None else stats
    probe = ctx.tombstone_probe and shard is not None
    skipped = getattr(shard.store, "internal_keys_skipped", None) if probe and shard else None
    before = skipped() if skipped is not None else 0
    body = _serve(shard, partition, request, ctx, stats)
    if skipped is not None:
        stats.tombstones_scanned = max(skipped() - before, 0)
    if isinstance(body, Error):
        body = msgspec.structs.replace(body, request_id=request.request_id)
    return MailboxReply(
        tenant_id=request.tenant_id,
        user_id=request.user_id,
        device_id=request.device_id,
        session_epoch=request.session_epoch,
        connection_shard=request.connection_shard,
        request_id=request.request_id,
        correlation_id=request.correlation_id,
        mailbox_shard=partition,
        auth_sync=body if isinstance(body, AuthSyncResult) else None,
        mailbox_batch=body if isinstance(body, MailboxBatch) else None,
        session_list=body if isinstance(body, SessionListBatch) else None,
        error=body if isinstance(body, Error) else None,
    )


def _serve(
    shard: OwnedShard | None,
    partition: int,
    request: ReadRequest,
    ctx: ReadContext,
    stats: ReadStats,
) -> Reply:
    tenant, user = request.tenant_id, request.user_id
    if shard is None or shard.config.shard_of(tenant, user) != partition:
        return shard_moved(ctx.retry_after_ms)  # not ours (any more), or misrouted
    lane = lane_id(tenant, user, shard.config.lane_count)
    w = shard.served_watermark(lane)
    if w is None:
        return shard_moved(ctx.retry_after_ms)
    probe = StorageProbe(shard.store, stats)
    if isinstance(request, PullSessionListRequest):
        return session_list_page(
            probe,
            request,
            shard.config.session_list,
            cursor_key=ctx.keys.subkey(ctx.keys.active_kid) or b"",
            snapshots=ctx.snapshots,
            now_ms=ctx.now_ms(),
        )
    reader = StoreMailboxReader(probe, shard.config.lane_count)
    trim = reader.effective_trim(tenant, user)
    if isinstance(request, SyncAuthRequest):
        return _sync_auth(shard, probe, reader, request, lane, w, trim, ctx)
    return _pull(probe, reader, request, w, trim, ctx)


def _sync_auth(
    shard: OwnedShard,
    probe: StorageProbe,
    reader: StoreMailboxReader,
    request: SyncAuthRequest,
    lane: int,
    w: int,
    trim: int,
    ctx: ReadContext,
) -> Reply:
    tenant, user = request.tenant_id, request.user_id
    identity = CursorIdentity(tenant, user, request.device_id, shard.shard, lane, shard.epoch)
    result = check_auth_cursor(
        request.cursor,
        identity=identity,
        lane_watermark=w,
        trim_watermark=trim,
        keys=ctx.keys,
        now_ms=ctx.now_ms(),
        resolve_boundary=lambda claims, seq: None,
        pending=lambda after, up_to: _pending(probe, reader, tenant, user, after, up_to),
    )
    if isinstance(result, Error):
        return result
    badge = badge_of_user(probe, tenant, user)
    return msgspec.structs.replace(
        _auth_result(result, shard.epoch),
        total_unread=badge.total_unread,
        total_mention=badge.total_mention,
        muted_unread=badge.muted_unread,
        badge_projection_mailbox_seq=badge.badge_projection_mailbox_seq,
        projection_complete=projection_complete(probe, tenant, user),
    )


def _auth_result(sync: AuthSync, shard_epoch: int) -> AuthSyncResult:
    return AuthSyncResult(
        kind=sync.kind.value,
        lane_id=sync.lane_id,
        lane_watermark=sync.lane_watermark,
        trim_watermark=sync.trim_watermark,
        sync_to_seq=sync.sync_to_seq,
        has_offline=sync.has_offline,
        pending_entry_count_hint=sync.pending_entry_count_hint,
        pending_bytes_hint=sync.pending_bytes_hint,
        start_seq=sync.start_seq,
        mailbox_cursor_token=sync.cursor_token,
        shard_epoch=shard_epoch,
    )


def _pending(
    probe: StorageProbe,
    reader: StoreMailboxReader,
    tenant: str,
    user: str,
    after: int,
    up_to: int,
) -> PendingSummary:
    """Exact ``has_entries``; counts from at most :data:`HINT_SCAN_CAP` entries."""
    count = size = 0
    for _, group in reader.read_user_range(tenant, user, after, up_to):
        probe.returned(len(group))
        count += len(group)
        size += sum(len(encode_body(entry)) for entry in group)
        if count >= HINT_SCAN_CAP:
            live = decode_u64(probe.get(count_key(tenant, user)))
            estimate = max(count, live)
            return PendingSummary(True, estimate, size * estimate // count)
    return PendingSummary(count > 0, count, size)


def _pull(
    probe: StorageProbe,
    reader: StoreMailboxReader,
    request: PullMailboxRequest,
    w: int,
    trim: int,
    ctx: ReadContext,
) -> Reply:
    tenant, user = request.tenant_id, request.user_id

    def read(after: int, up_to: int) -> Iterator[Group]:
        for seq, group in reader.read_user_range(tenant, user, after, up_to):
            probe.returned(len(group))
            joined = join_bodies(reader, tenant, group)
            yield seq, [opened_entry(ctx.bodies, tenant, e) for e in joined]

    return pull_mailbox(
        read,
        request.message,
        lane_watermark=w,
        trim_watermark=trim,
        limits=ctx.limits,
        trim_after_scan=lambda: reader.effective_trim(tenant, user),
    )
