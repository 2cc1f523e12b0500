"""What the outbox says must exist in the MailboxStores: every recipient entry, derived alone.

Why a second derivation next to ``audit_fanout`` (spec 0.2 orphan audit, 19.1 boundaries 2-3):
the dispatch log can be sound while a MailboxNode lost, doubled or misplaced an entry, so the
expected entries are computed from the commit facts only -- never from the member slices on the
dispatch log nor from a store. The outbox is replayed through a fresh ``FanoutState`` (the same
pure function the FanoutCoordinator runs); its own ``GroupMembership`` replica gives the members
of the version a dispatch pins (10.1 step 3: exactly that version), and the shared expansion
rule (``entries_by_user``, the MailboxNode's own) turns each expected dispatch into the entries
each recipient gets, with their frozen ``event_id`` and stored value.

In log order a message always pins the group's current version, so the members of a version are
cut when the first dispatch pinning it appears, while the replica is still there; a dispatch
pinning a version the replica has already left behind (never in a writer's outbox) is reported
as unreplayable instead of guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from qim.core.fanout import FanoutConfig, FanoutState, NotReady
from qim.core.fanout.state import FanoutLogError
from qim.core.mailbox.expand import entries_by_user
from qim.core.mailbox.values import StoredEntry
from qim.core.membership import MembershipLogError, ShardSlice, bitmap_bytes
from qim.core.membership.group import GroupState
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.outbox import GROUP, MessageReacted, OutboxRecord

__all__ = ["EntryKey", "Expected", "ExpectedEntry", "expected_entries"]

EntryKey = tuple[int, str, str, int]
"""``(mailbox_shard, tenant_id, user_id, event_id)``: one entry, wherever it was written."""


@dataclass(frozen=True, slots=True)
class ExpectedEntry:
    """One entry the outbox requires: its event ordinal, value and the dispatch behind it."""

    dispatch: GroupDispatch
    event_ordinal: int
    entry: StoredEntry


@dataclass
class Expected:
    """The entries of a window of the outbox, and the records that could not be replayed."""

    entries: dict[EntryKey, ExpectedEntry] = field(default_factory=dict)
    dispatches: int = 0
    unreplayable: list[tuple[str, str]] = field(default_factory=list)
    """``(message_id hex, reason)`` of records no expectation could be derived for."""


def _shard_slice(group: GroupState, shard: int) -> ShardSlice:
    slots = tuple(group.shard_slots(shard))
    rows = [group.user_at(slot) for slot in slots]
    return ShardSlice(
        tenant_id=group.tenant_id,
        group_id=group.group_id,
        membership_version=group.version,
        mailbox_shard=shard,
        member_count=group.member_count,
        slot_bitmap=bitmap_bytes(slots),
        slots=slots,
        user_ids=tuple(r.user_id for r in rows),
        joined_at=tuple(r.joined_at for r in rows),
    )


class _Slices:
    """Per-shard members of each pinned version, cut from the replica while it is there."""

    def __init__(self, state: FanoutState) -> None:
        self._state = state
        self._cut: dict[tuple[str, str, int, int], ShardSlice] = {}

    def get(self, d: GroupDispatch) -> ShardSlice | str | None:
        """The slice ``d`` pins (None: it pins none), or why it cannot be known."""
        if d.conversation_kind != GROUP or d.membership_version == 0:
            return None
        key = (d.tenant_id, d.conversation_id, d.membership_version, d.target_mailbox_shard)
        found = self._cut.get(key)
        if found is not None:
            return found
        group = self._state.membership.group(d.tenant_id, d.conversation_id)
        if group is None or group.version != d.membership_version:
            known = 0 if group is None else group.version
            return f"pins v{d.membership_version}, replica at v{known}"
        found = self._cut[key] = _shard_slice(group, d.target_mailbox_shard)
        return found


def expected_entries(
    outbox_records: Iterable[OutboxRecord],
    *,
    config: FanoutConfig,
    mention_entries: bool,
    skip: Callable[[OutboxRecord], bool] | None = None,
    later: Collection[tuple[str, bytes]] = (),
) -> Expected:
    """Replay ``outbox_records`` (log order per partition) into the entries they require.

    ``skip`` records are applied (membership must follow the whole log) but expect nothing;
    ``later`` ``(tenant, message_id)`` are too (committed after the audited window).
    """
    state = FanoutState(config)
    slices = _Slices(state)
    out = Expected()
    for record in outbox_records:
        if isinstance(record, MessageReacted):
            continue  # dispatches nothing (13.6.1)
        ignored = (skip is not None and skip(record)) or (
            any(record.message_id) and (record.tenant_id, record.message_id) in later
        )
        try:
            produced = state.apply_outbox(record)
        except (MembershipLogError, FanoutLogError) as exc:
            out.unreplayable.append((record.message_id.hex(), repr(exc)))
            continue
        if isinstance(produced, NotReady):
            out.unreplayable.append((produced.message_id.hex(), str(produced.reason)))
            continue
        if ignored:
            continue
        for d in produced:
            if isinstance(d, GroupDispatch):
                _expand(d, slices, config, mention_entries, out)
    return out


def _expand(
    d: GroupDispatch, slices: _Slices, config: FanoutConfig, mention_entries: bool, out: Expected
) -> None:
    shard_slice = slices.get(d)
    if isinstance(shard_slice, str):
        out.unreplayable.append((d.message_id.hex(), shard_slice))
        return
    out.dispatches += 1
    tenant = d.tenant_id
    groups = entries_by_user(
        d, shard_slice, lambda user: config.shard_of(tenant, user), mention_entries=mention_entries
    )
    for user, rows in groups.items():
        for row in rows:
            key = (d.target_mailbox_shard, tenant, user, row.event_id)
            out.entries.setdefault(key, ExpectedEntry(d, row.event_ordinal, row.entry))
