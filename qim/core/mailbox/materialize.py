"""MailboxNode materialization: one batch of the dispatch log -> one WriteBatch (spec 10.1).

``materialize`` is a left fold over ``(offset, record)`` pairs in log order. Each record's
effect depends only on the store and the record, never on where the shell cut the batch, so
any cutting of the same log yields the same bytes (direction.md 4.2, 4.7; I-5). Per
GroupDispatch, in seed 003's order (section 3.1):

1. ``mailbox_seq = compose(shard_epoch, offset)``; a record at or below the applied seq was
   folded before (the shell re-reads from :func:`~qim.core.mailbox.lanes.resume_offset`) and
   is skipped.
2. dispatch_id dedup against DispatchProgress, before any expansion (10.1 step 7, 10.1.2): a
   re-appended dispatch is ignored, its first offset defines the mailbox_seq.
3. ``fencing_epoch`` filter per (tenant, conversation), monotone: a lower epoch is dropped
   whole and counted in ``stale_epoch_dispatch_dropped_total`` (19.2.1 check point 2).
4. recipients: explicit participants on this shard, plus the pinned version's slice members
   through the boundary filter (the rule shared with the FanoutCoordinator, ``expand``).
5. entries, the shard's body copy, counts and the DispatchProgress row go into the batch;
   users crossing the entry cap are trimmed right there (``retention``). A recall / edit /
   delete also rewrites its target's facts row and body copy first (``amend``).

A group dispatch whose slice is not complete yet (ADR-0017 lets a retried chunk land after
it) is NOT skipped: it is kept under its mailbox_seq (``P`` key) and counted in
``dispatch_pending_slice_total``; the chunk that completes the slice materializes it, at its
own mailbox_seq. Until then it holds back every lane -- its members are unknown, so any lane
may get an entry -- and no client is told it has seen past it. The shell keeps consuming -- the
missing chunk is further down the same partition -- and alerts while the result's ``pending``
is non-empty; W (and so ``resume_offset``) stays below it, and a restart finds it in the store.
A slice whose chunks cannot be assembled fails closed the same way (``member_slice_invalid``).

A ``ReactionSummary`` (13.6, 18.3.1) writes no entry: its absolute counts overwrite those on the
message's facts row when its ``summary_version`` is newer, so PULL_MAILBOX returns the aggregate
with the message (``reader.join_bodies``); the row's bytes depend on the log alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from qim.core.mailbox import keys
from qim.core.mailbox.amend import amend_target, amended
from qim.core.mailbox.config import DAY_MS, MailboxConfig
from qim.core.mailbox.expand import entries_by_user
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.lanes import LaneHold, advance_watermarks, lane_mask, raise_floor
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.read_diffusion import ONLINE_ACTION, advance_head, is_active, note_activity
from qim.core.mailbox.result import (
    FIRST_SHARD_EPOCH,
    METRICS,
    MaterializeResult,
    PendingDispatch,
    WrittenGroup,
)
from qim.core.mailbox.retention import expiry_at, trim_user
from qim.core.mailbox.session_store import decode_facts, encode_facts, facts_key
from qim.core.mailbox.sessions import SessionFolds
from qim.core.mailbox.slicestore import SliceCache, load_departures, load_slice, store_chunk
from qim.core.mailbox.user_state import apply_command, apply_membership
from qim.core.mailbox.values import (
    DispatchProgress,
    ProgressState,
    ShardMeta,
    StoredBody,
    decode_u64,
    decode_value,
    decode_vector,
    encode_u64,
    encode_value,
    encode_vector,
)
from qim.core.membership.errors import MembershipLogError
from qim.core.membership.slices import ShardSlice
from qim.schemas.events import EventType
from qim.schemas.records.dispatch import (
    GroupDispatch,
    ReactionSummary,
    ShardLogRecord,
    decode_dispatch_record,
    encode_dispatch_record,
)
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.user_state import UserStateCommand
from qim.schemas.routing import lane_id
from qim.schemas.seqs import MAX_EPOCH, compose_mailbox_seq

__all__ = ["materialize"]

_EVENT_TYPES = frozenset(int(t) for t in EventType)


def materialize(
    view: KVReader,
    batch: Sequence[tuple[int, ShardLogRecord]],
    *,
    shard_epoch: int,
    config: MailboxConfig,
    slice_cache: SliceCache | None = None,
) -> MaterializeResult:
    """Fold ``batch`` (offsets ascending, as read from the shard's partition) into ``view``."""
    if not FIRST_SHARD_EPOCH <= shard_epoch <= MAX_EPOCH:
        raise ValueError(f"shard_epoch must be in [{FIRST_SHARD_EPOCH}, {MAX_EPOCH}]")
    fold = _Fold(view, shard_epoch, config, slice_cache)
    for offset, record in batch:
        fold.apply(offset, record)
    return fold.finish()


class _Fold:
    def __init__(
        self, view: KVReader, epoch: int, config: MailboxConfig, cache: SliceCache | None
    ) -> None:
        self.kv = Overlay(view)
        self.config = config
        self.epoch = epoch
        self.cache = cache
        raw = view.get(keys.META)
        self.meta = ShardMeta() if raw is None else decode_value(raw, ShardMeta)
        if self.meta.shard_epoch > epoch:
            raise ValueError(f"store is at shard_epoch {self.meta.shard_epoch}, not {epoch}")
        self.applied = self.meta.applied_seq
        self.log_now = self.meta.log_now_ms
        self.watermarks = decode_vector(view.get(keys.WATERMARKS), config.lane_count)
        self.floor = decode_vector(view.get(keys.FLOOR), config.lane_count)
        self.pending: dict[int, PendingDispatch] = {}
        for key, value in view.scan(keys.PENDING, keys.PENDING, False):
            dispatch = decode_dispatch_record(value)
            assert isinstance(dispatch, GroupDispatch)
            seq = keys.pending_seq(key)
            self.pending[seq] = PendingDispatch(seq, dispatch)
        self.written: list[WrittenGroup] = []
        self.metrics = dict.fromkeys(METRICS, 0)
        self.cap_evicted: dict[str, int] = {}
        self.sessions = SessionFolds(self.kv, config.session_list)
        self.sessions.log_now_ms = self.log_now

    def apply(self, offset: int, record: ShardLogRecord) -> None:
        seq = compose_mailbox_seq(self.epoch, offset)
        if seq <= self.applied:
            self.metrics["dispatch_record_replayed_total"] += 1
            return
        self.applied = seq
        if isinstance(record, GroupDispatch):
            self._dispatch(seq, record)
        elif isinstance(record, MemberSliceRecord):
            self._slice(record)
        elif isinstance(record, UserStateCommand):
            self._user_state(seq, record)
        elif isinstance(record, ReactionSummary):
            self._reaction(record)
        else:  # a kind this build does not know yet: occupies its offset, changes nothing
            self.metrics["unknown_record_total"] += 1

    def _dispatch(self, seq: int, d: GroupDispatch) -> None:
        if d.target_mailbox_shard != self.config.mailbox_shard:
            self.metrics["dispatch_misrouted_total"] += 1
            return
        self.log_now = max(self.log_now, d.committed_at)
        self.sessions.log_now_ms = self.log_now
        raw = self.kv.get(keys.dispatch_key(d.tenant_id, d.dispatch_id))
        if raw is not None:
            seen = decode_value(raw, DispatchProgress)
            if seen.state == ProgressState.PENDING or seen.expire_at > self.log_now:
                self.metrics["dispatch_duplicate_suppressed_total"] += 1
                return
        if d.event_type not in _EVENT_TYPES:
            self.metrics["dispatch_invalid_total"] += 1
            return
        fencing = keys.fencing_key(d.tenant_id, d.conversation_id)
        highest = decode_u64(self.kv.get(fencing))
        if d.fencing_epoch < highest:
            self.metrics["stale_epoch_dispatch_dropped_total"] += 1
            return
        if d.fencing_epoch > highest:
            self.kv.put(fencing, encode_u64(d.fencing_epoch))
        shard_slice = None
        if d.conversation_kind == "group" and d.membership_version > 0:
            key = (d.tenant_id, d.conversation_id, d.membership_version)
            shard_slice = load_slice(self.kv, key, self.cache)
            if shard_slice is None:
                self._pend(seq, d)
                return
        self._expand(seq, d, shard_slice)

    def _slice(self, record: MemberSliceRecord) -> None:
        if record.mailbox_shard != self.config.mailbox_shard:
            self.metrics["dispatch_misrouted_total"] += 1
            return
        self.metrics["member_slice_chunks_total"] += 1
        try:
            completed = store_chunk(self.kv, record, self.log_now)
        except MembershipLogError:
            self.metrics["member_slice_invalid_total"] += 1
            return
        if completed is None:
            return
        key = (record.tenant_id, record.group_id, record.membership_version)
        if self.cache is not None:
            self.cache.put(key, completed)
        for seq in sorted(s for s, p in self.pending.items() if p.slice_key == key):
            waiting = self.pending.pop(seq)
            self.kv.delete(keys.pending_key(seq))
            self.metrics["dispatch_slice_resolved_total"] += 1
            self._expand(seq, waiting.dispatch, completed)

    def _pend(self, seq: int, d: GroupDispatch) -> None:
        self.kv.put(keys.pending_key(seq), encode_dispatch_record(d))
        progress = DispatchProgress(mailbox_seq=seq, state=ProgressState.PENDING)
        self.kv.put(keys.dispatch_key(d.tenant_id, d.dispatch_id), encode_value(progress))
        self.pending[seq] = PendingDispatch(seq, d)
        self.metrics["dispatch_pending_slice_total"] += 1

    def _expand(self, seq: int, d: GroupDispatch, shard_slice: ShardSlice | None) -> None:
        tenant, config, kv = d.tenant_id, self.config, self.kv
        keep_copies = d.amend_action is None and not amended(kv, d)
        if d.amend_action is not None:  # before the fold: the recount reads it as of seq
            amend_target(kv, d, seq)
        departures = None
        if shard_slice is not None:
            departures = load_departures(kv, tenant, d.conversation_id)
        message = d.amend_action is None and d.event_type == EventType.MESSAGE
        read_diffusion = message and d.write_policy == "mention_only"
        if message and d.conversation_kind == "group":  # the 10.2.3 active set and head
            if config.in_this_shard(tenant, d.sender_id):
                note_activity(kv, tenant, d.sender_id, d.committed_at)
            advance_head(kv, d)
        now, window = self.log_now, config.active_window_ms
        groups = entries_by_user(
            d,
            shard_slice,
            lambda user: config.shard_of(tenant, user),
            mention_entries=config.mention_entries,
            departures=departures,
            is_active=lambda user: is_active(kv, tenant, user, now, window),
        )
        lanes: set[int] = set()
        over_cap: list[str] = []
        written = 0
        for user, rows in groups.items():
            for row in rows:
                key = keys.entry_key(tenant, user, seq, row.event_ordinal, row.event_id)
                kv.put(key, encode_value(row.entry))
            counter = keys.count_key(tenant, user)
            count = decode_u64(kv.get(counter)) + len(rows)
            kv.put(counter, encode_u64(count))
            lane = lane_id(tenant, user, config.lane_count)
            lanes.add(lane)
            written += len(rows)
            self.written.append(WrittenGroup(tenant, user, lane, seq, len(rows)))
            if d.event_type == EventType.MEMBERSHIP:
                apply_membership(self.sessions, seq, d, user, rows[0].event_id)
            self.sessions.entries(tenant, user, seq, rows)
            if count > config.max_mailbox_entries_per_user:
                over_cap.append(user)
        # a read-diffusion message keeps its shard copies even with no entry here: the session
        # list's preview of a silent member joins them (10.2.3 data source)
        kept = written or read_diffusion
        if kept and not d.inline_body and (keep_copies or d.amend_action is not None):
            self._keep_body(d)  # an amend's own body: an edit's new payload
        if kept and keep_copies:
            self._keep_facts(seq, d)
        dkey = keys.dispatch_key(tenant, d.dispatch_id)
        expire = d.committed_at + config.dispatch_progress_retention_ms
        progress = DispatchProgress(
            mailbox_seq=seq,
            entries_written=written,
            lane_mask=lane_mask(sorted(lanes), config.lane_count),
            expire_at=expire,
        )
        kv.put(dkey, encode_value(progress))
        kv.put(keys.expiry_key(expire, dkey), b"")
        self.metrics["mailbox_entries_written_total"] += written
        for user in over_cap:
            done = trim_user(
                kv,
                tenant,
                user,
                now_ms=self.log_now,
                bound_seq=self._bound(),
                retention_days=config.retention_days(tenant),
                cap=config.max_mailbox_entries_per_user,
                cap_target=config.cap_target,
                carry_limit=config.session_list.unread_precise_limit,
            )
            self.metrics["mailbox_entry_cap_evicted_total"] += done.evicted
            if done.evicted:
                self.cap_evicted[tenant] = self.cap_evicted.get(tenant, 0) + done.evicted
            self.metrics["mailbox_entries_expired_total"] += done.expired

    def _keep_body(self, d: GroupDispatch) -> None:
        """One copy per shard for the read-time join, expiring with the entries (18.3.1)."""
        body = StoredBody(
            conversation_id=d.conversation_id,
            conversation_seq=d.conversation_seq,
            message_type=d.message_type,
            custom_type=d.custom_type,
            schema_version=d.schema_version,
            payload=d.payload,
        )
        bkey = keys.body_key(d.tenant_id, d.message_id)
        self.kv.put(bkey, encode_value(body))
        expire = expiry_at(d.committed_at, self.config.retention_days(d.tenant_id))
        if d.retention_class == "ephemeral_24h":  # 7.1: gone after 24 h, references too
            expire = min(expire, d.committed_at + DAY_MS)
        self.kv.put(keys.expiry_key(expire, bkey), b"")

    def _reaction(self, r: ReactionSummary) -> None:
        """A newer aggregate onto the message's facts row (13.6, 18.3.1): the row every copy of
        the message has on this shard, inline or not, and the one PULL_MAILBOX's join already
        reads for the recall state. No entry, no count, no push (13.6.1, INV-36). A message
        this shard holds no live row of (expired, not here yet, another shard's, recalled) is
        left alone; an older or repeated version changes nothing. Log-only inputs: a replay
        cut anywhere writes the same bytes."""
        if r.target_mailbox_shard != self.config.mailbox_shard:
            self.metrics["dispatch_misrouted_total"] += 1
            return
        fkey = facts_key(r.tenant_id, r.conversation_id, r.conversation_seq, r.message_id)
        raw = self.kv.get(fkey)
        if raw is None:
            return
        facts = decode_facts(raw)
        if (
            r.summary_version <= facts.summary_version
            or facts.removed_mailbox_seq != 0
            or facts.expired_by(self.log_now)
        ):
            return
        new = msgspec.structs.replace(
            facts,
            reaction_counts=dict(sorted((k, v) for k, v in r.counts.items() if v > 0)),
            summary_version=r.summary_version,
        )
        self.kv.put(fkey, encode_facts(new))
        self.metrics["reaction_summary_applied_total"] += 1

    def _keep_facts(self, seq: int, d: GroupDispatch) -> None:
        """The session recount's copy of the message (``session_store.StoredFacts``), expiring
        with the body."""
        expire = expiry_at(d.committed_at, self.config.retention_days(d.tenant_id))
        if d.retention_class == "ephemeral_24h":
            expire = min(expire, d.committed_at + DAY_MS)
        fkey = self.sessions.facts(d, seq, expire)
        self.kv.put(keys.expiry_key(expire, fkey), b"")

    def _user_state(self, seq: int, c: UserStateCommand) -> None:
        """A user's own state change (12.9): the 7.5 row, the CONTROL entry, the projection."""
        if c.target_mailbox_shard != self.config.mailbox_shard or not self.config.in_this_shard(
            c.tenant_id, c.user_id
        ):
            self.metrics["dispatch_misrouted_total"] += 1
            return
        self.log_now = max(self.log_now, c.committed_at)
        self.sessions.log_now_ms = self.log_now
        note_activity(self.kv, c.tenant_id, c.user_id, c.committed_at)  # a read: active (10.2.3)
        if c.action == ONLINE_ACTION:
            return  # a login: activity only, no state and no entry
        rows = apply_command(self.sessions, seq, c)
        if not rows:
            return
        tenant, user = c.tenant_id, c.user_id
        for row in rows:
            key = keys.entry_key(tenant, user, seq, row.event_ordinal, row.event_id)
            self.kv.put(key, encode_value(row.entry))
        counter = keys.count_key(tenant, user)
        self.kv.put(counter, encode_u64(decode_u64(self.kv.get(counter)) + len(rows)))
        self.metrics["mailbox_entries_written_total"] += len(rows)
        lane = lane_id(tenant, user, self.config.lane_count)
        self.written.append(WrittenGroup(tenant, user, lane, seq, len(rows)))  # pushed too

    def _bound(self) -> int:
        """Highest mailbox_seq every lane has materialized at this point of the fold: trims
        stop there, so a line never passes a dispatch still waiting for its slice."""
        return min([self.applied, *(seq - 1 for seq in self.pending)])

    def finish(self) -> MaterializeResult:
        holds = [LaneHold(seq) for seq in sorted(self.pending)]
        watermarks, regressions = advance_watermarks(self.watermarks, self.applied, holds)
        self.metrics["lane_watermark_regression_total"] += regressions
        floor = raise_floor(self.floor, watermarks)
        if watermarks != self.watermarks:
            self.kv.put(keys.WATERMARKS, encode_vector(watermarks))
        if floor != self.floor:
            self.kv.put(keys.FLOOR, encode_vector(floor))
        sessions = self.sessions.finish()
        meta = ShardMeta(applied_seq=self.applied, shard_epoch=self.epoch, log_now_ms=self.log_now)
        if meta != self.meta:
            self.kv.put(keys.META, encode_value(meta))
        return MaterializeResult(
            ops=self.kv.ops(),
            watermarks=watermarks,
            watermark_floor=floor,
            applied_seq=self.applied,
            pending=tuple(self.pending[seq] for seq in sorted(self.pending)),
            written=tuple(self.written),
            metrics=self.metrics,
            cap_evicted=dict(sorted(self.cap_evicted.items())),
            sessions=sessions,
        )
