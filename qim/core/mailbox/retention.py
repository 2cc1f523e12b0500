"""Mailbox trimming (spec 18.3.2-18.3.3, 6.5.2): by time window and by the per-user entry cap.

Two triggers, one mechanism: trimming deletes a user's oldest event groups (whole groups, in
mailbox_seq order, so a group is never half gone, I-003-1) and raises that user's trim line,
so ``effective_trim(u)`` is monotone and everything above it is intact. Trimming never looks at
device cursors (18.3.3): a lagging device gets CURSOR_EXPIRED and REBUILDs.

* Time window: an entry expires at the end of its UTC day bucket plus ``mailbox_retention_days``
  (:func:`expiry_at`, ADR-0023). "Now" is the log time -- the highest ``committed_at`` folded --
  never a wall clock, so a replica trims the same entries. Expiry is absolute, so trimming at
  log time t1 and then t2 leaves what trimming once at t2 leaves.
* Entry cap: ``max_mailbox_entries_per_user`` exceeded -> expired groups go first, then the
  oldest groups until ``cap x mailbox_entry_cap_hysteresis`` remain; every eviction is counted
  (``mailbox_entry_cap_evicted_total``, a P2 alert). The cap is history dependent, so it runs
  only inside the fold, after the record that crossed it -- at the same log position on every
  replica -- and :func:`retention_sweep` never applies it.
* Never above the user's lane watermark: a trim line below W cannot overtake a dispatch that
  is still waiting to be materialized at a lower mailbox_seq.

:func:`retention_sweep` is the periodic job: time-window trim for every user with entries,
then the expiry index (stored bodies, DispatchProgress past ``dispatch_progress_retention``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from qim.core.mailbox.carry import carry_trimmed
from qim.core.mailbox.config import DAY_MS, MailboxConfig
from qim.core.mailbox.keys import (
    COUNT,
    DISPATCH,
    EXPIRY,
    META,
    WATERMARKS,
    count_key,
    expiry_target,
    parse_entry_key,
    parse_user_key,
    trim_key,
    user_entry_prefix,
)
from qim.core.mailbox.kvstore import Overlay
from qim.core.mailbox.ports import KVReader, Op
from qim.core.mailbox.values import (
    DispatchProgress,
    ShardMeta,
    StoredEntry,
    TrimState,
    decode_u64,
    decode_value,
    decode_vector,
    encode_u64,
    encode_value,
)
from qim.schemas.routing import lane_id

__all__ = ["SweepResult", "UserTrim", "expiry_at", "retention_sweep", "trim_user"]


def expiry_at(created_at_ms: int, retention_days: int) -> int:
    """End of the entry's UTC day bucket D plus the window: ``(D + days + 1) x 86400 s``."""
    return (created_at_ms // DAY_MS + retention_days + 1) * DAY_MS


@dataclass(frozen=True, slots=True)
class UserTrim:
    """What one :func:`trim_user` call deleted and the user's trim lines afterwards."""

    expired: int
    evicted: int
    trim: TrimState


def trim_user(
    kv: Overlay,
    tenant_id: str,
    user_id: str,
    *,
    now_ms: int,
    bound_seq: int,
    retention_days: int,
    cap: int | None = None,
    cap_target: int = 0,
    carry_limit: int,
) -> UserTrim:
    """Trim one user's mailbox at log time ``now_ms``, never above ``bound_seq``.

    First the leading groups whose entries have all expired; then, if more than ``cap``
    entries remain, the oldest groups until at most ``cap_target`` do. What the session fold
    still needs of the trimmed entries is carried (``carry``, ``carry_limit`` =
    ``unread_precise_limit``), so the list can be rebuilt after the trim (12.1, issue 14).
    """
    remaining = decode_u64(kv.get(count_key(tenant_id, user_id)))
    old = _trim_state(kv, tenant_id, user_id)
    ttl_seq, user_seq = old.ttl_trim_seq, old.user_trim_seq
    doomed: list[tuple[bytes, StoredEntry]] = []
    expired = evicted = 0
    cap_active: bool | None = None  # decided where the expired run ends
    for seq, rows in _groups(kv, user_entry_prefix(tenant_id, user_id)):
        if seq > bound_seq:
            break
        if cap_active is None:
            if all(expiry_at(e.created_at, retention_days) <= now_ms for _, e in rows):
                doomed += rows
                expired += len(rows)
                remaining -= len(rows)
                ttl_seq = max(ttl_seq, seq)
                continue
            cap_active = cap is not None and remaining > cap
        if not cap_active or remaining <= cap_target:
            break
        doomed += rows
        evicted += len(rows)
        remaining -= len(rows)
        user_seq = max(user_seq, seq)
    for key, _ in doomed:
        kv.delete(key)
    carry_trimmed(kv, tenant_id, user_id, doomed, carry_limit)
    trim = TrimState(ttl_trim_seq=ttl_seq, user_trim_seq=user_seq)
    if doomed:
        counter = count_key(tenant_id, user_id)
        if remaining > 0:
            kv.put(counter, encode_u64(remaining))
        else:
            kv.delete(counter)
    if trim != old:
        kv.put(trim_key(tenant_id, user_id), encode_value(trim))
    return UserTrim(expired=expired, evicted=evicted, trim=trim)


def _trim_state(kv: KVReader, tenant_id: str, user_id: str) -> TrimState:
    raw = kv.get(trim_key(tenant_id, user_id))
    return TrimState() if raw is None else decode_value(raw, TrimState)


def _groups(kv: KVReader, prefix: bytes) -> Iterator[tuple[int, list[tuple[bytes, StoredEntry]]]]:
    """The user's event groups, ascending, read lazily (one key of look-ahead)."""
    seq = -1
    rows: list[tuple[bytes, StoredEntry]] = []
    for key, value in kv.scan(prefix, prefix, False):
        key_seq = parse_entry_key(key).mailbox_seq
        if rows and key_seq != seq:
            yield seq, rows
            rows = []
        seq = key_seq
        rows.append((key, decode_value(value, StoredEntry)))
    if rows:
        yield seq, rows


@dataclass(frozen=True, slots=True)
class SweepResult:
    """One retention pass as a WriteBatch, and what it removed."""

    ops: tuple[Op, ...]
    now_ms: int
    metrics: dict[str, int] = field(default_factory=dict)


def retention_sweep(view: KVReader, now_ms: int, config: MailboxConfig) -> SweepResult:
    """Time-window trim of every user, then expired bodies and DispatchProgress rows.

    ``now_ms`` is clamped to the store's log time: trimming ahead of the log would delete what
    a later record's fold still counts, and replicas would diverge. Deterministic: users and
    index keys are walked in key order.
    """
    kv = Overlay(view)
    meta_raw = view.get(META)
    log_now = 0 if meta_raw is None else decode_value(meta_raw, ShardMeta).log_now_ms
    now = min(now_ms, log_now)
    watermarks = decode_vector(view.get(WATERMARKS), config.lane_count)
    metrics = {"mailbox_entries_expired_total": 0, "mailbox_index_expired_total": 0}
    users = [parse_user_key(key) for key, _ in kv.scan(COUNT, COUNT, False)]
    for tenant_id, user_id in users:
        lane = lane_id(tenant_id, user_id, config.lane_count)
        done = trim_user(
            kv,
            tenant_id,
            user_id,
            now_ms=now,
            bound_seq=watermarks[lane],
            retention_days=config.retention_days(tenant_id),
            carry_limit=config.session_list.unread_precise_limit,
        )
        metrics["mailbox_entries_expired_total"] += done.expired
    due: list[tuple[bytes, bytes]] = []
    for key, _ in kv.scan(EXPIRY, EXPIRY, False):
        expire_at, target = expiry_target(key)
        if expire_at > now:
            break
        due.append((key, target))
    for key, target in due:
        kv.delete(key)
        if target.startswith(DISPATCH) and not _progress_expires(kv.get(target), key):
            continue  # re-materialized after its window: the row has a newer index key
        kv.delete(target)
        metrics["mailbox_index_expired_total"] += 1
    return SweepResult(ops=kv.ops(), now_ms=now, metrics=metrics)


def _progress_expires(raw: bytes | None, index_key: bytes) -> bool:
    if raw is None:
        return False
    return decode_value(raw, DispatchProgress).expire_at == expiry_target(index_key)[0]
