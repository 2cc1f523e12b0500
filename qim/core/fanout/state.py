"""``FanoutState``: the FanoutCoordinator of one outbox partition as a pure state machine.

One method carries all of it, live and in replay (style item 3): :meth:`FanoutState.apply_outbox`
folds one outbox record in, in log order, and returns exactly the GroupDispatch records to
produce to the dispatch log, each with its explicit partition (``record.partition``, the target
MailboxShard, never a key hash: spec 6.5). Replaying the outbox into a fresh state yields the
same records, byte for byte (spec 6.7 I-5, 10.4.2).

* ``MembershipCommitted``: applied to the state's own ``GroupMembership`` replica -- the
  FanoutCoordinator consumes the same outbox as the ConversationWriter and rebuilds membership
  from it -- to learn each version's target shards. Member slices are NOT produced here: the
  ConversationWriter publishes them in the same Kafka transaction as the outbox record
  (``qim.core.membership`` docs, ``qim.agents.writer.txn``), and this consumer reads the outbox
  read_committed, so a version's slices are already in every dispatch partition before any
  dispatch pinned to it is produced (direction 4.3); producing them twice would only double the
  slice traffic. The CONTROL message of an add/remove/ban/leave is then dispatched
  (``qim.core.fanout.build``). A create occupies no seq and has no ids (A.3): no dispatch; its
  members learn of the group from its first message or from CREATE_GROUP's reply.
* ``MessageCommitted``: the pinned ``membership_version`` is read exactly (10.1 step 3); the
  target shards are the shards with members in it (group) or of the participants (direct,
  S <= 2, one dispatch when both share a shard); one GroupDispatch per shard (7.8), split only
  when its event group would break the 6.7 caps (``qim.core.fanout.event_group``).
* ``MessageAmended`` (recall / edit / delete): exactly like a message (its own seq, its own
  message_id in the ``dispatch_id``), built as a CONTROL dispatch (``build.amend_dispatch``).
* ``MessageReacted``: no GroupDispatch. Reactions are ``ephemeral_aggregate`` (13.6.1): no
  mailbox entry on any shard; the ConversationWriter pushes REACTION_UPDATE to online members
  itself (``qim.core.reactions.push``). What goes out is one :class:`ReactionSummary` per shard
  with members in the reaction's version (direct: the participants' shards): the record's
  absolute counts, which the MailboxNode keeps on the message's facts row so PULL_MAILBOX
  returns the aggregate with the message (13.6, 18.3.1; it never reads the MessageStore,
  direction 4.4). A
  version this state does not hold yields none rather than a hold: the copy is a read-time
  convenience, the MessageStore (PULL_HISTORY) stays the authority, and an aggregate must never
  stall the partition's messages.

Idempotency (ADR-0012 at-least-once): a record applied twice yields the same dispatches -- they
depend only on the record and its pinned version, which is immutable; a redelivered membership
record changes no state and re-dispatches its CONTROL message identically. A message whose
pinned version this state has not seen (a pending create, a state restored behind the log) or
no longer keeps returns :class:`NotReady`, and so does a membership change that does not follow
the group's version; nothing is dropped and nothing changes. A malformed record raises
(``MembershipLogError``, :class:`FanoutLogError`): the log is not ours. The driver checkpoints
this state (:meth:`FanoutState.encode`) only after everything returned is acknowledged.

Why old versions are kept: spec 10.1 step 3 -- fanout MUST read exactly the pinned version,
never the one current at consume time. In log order a message pins the current version, but a
redelivered record (ADR-0012; a rewind after a crash) may pin one that later changes superseded.
Its target shards (the shards with members in it) are all fanout needs, so that is all that is
kept: a few ints per version, ``max_retained_versions`` per group; an older one is reported as
retired, never guessed. The ``fencing_epoch`` stamped on a version's CONTROL dispatches is kept
with it (``MembershipCommitted`` has none): the group's highest epoch when the version was first
applied, so a redelivery stamps the same value.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from qim.core.fanout.build import (
    amend_dispatch,
    membership_dispatch,
    message_dispatch,
    shards_of,
)
from qim.core.fanout.config import FanoutConfig
from qim.core.fanout.event_group import split_event_groups
from qim.core.membership import GroupMembership
from qim.schemas.frames.base import U32, U64
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch, ReactionSummary
from qim.schemas.records.membership import MembershipAction, MembershipCommitted
from qim.schemas.records.outbox import (
    DIRECT,
    MessageAmended,
    MessageCommitted,
    MessageReacted,
    OutboxRecord,
)

__all__ = ["FanoutLogError", "FanoutState", "NotReady", "NotReadyReason", "VersionInfo"]

_ENCODER = msgspec.msgpack.Encoder()

GroupKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One membership version as fanout needs it."""

    shards: tuple[int, ...]
    """MailboxShards with >= 1 member in the version, ascending."""
    fencing_epoch: int


class _Row(msgspec.Struct, array_like=True, frozen=True):
    tenant_id: str
    group_id: str
    version: U64
    fencing_epoch: U64
    shards: tuple[U32, ...]


class _VersionHistory:
    """Per group, the retained versions in ascending order (oldest evicted first)."""

    def __init__(self, max_retained_versions: int) -> None:
        self.max_retained = max_retained_versions
        self._groups: dict[GroupKey, dict[int, VersionInfo]] = {}

    def record(self, key: GroupKey, version: int, info: VersionInfo) -> None:
        """Remember ``version`` (versions arrive ascending per group: GroupMembership checks)."""
        versions = self._groups.setdefault(key, {})
        versions[version] = info
        while len(versions) > self.max_retained:
            del versions[min(versions)]

    def get(self, key: GroupKey, version: int) -> VersionInfo | None:
        versions = self._groups.get(key)
        return None if versions is None else versions.get(version)

    def shards_through(self, key: GroupKey, version: int) -> set[int]:
        """Every shard with a member in a retained version up to ``version``."""
        versions = self._groups.get(key, {})
        return {s for v, info in versions.items() if v <= version for s in info.shards}

    def rows(self) -> tuple[_Row, ...]:
        """Canonical rows, sorted by (tenant, group, version)."""
        return tuple(
            _Row(key[0], key[1], version, info.fencing_epoch, info.shards)
            for key, versions in sorted(self._groups.items())
            for version, info in sorted(versions.items())
        )

    def restore(self, rows: Iterable[_Row]) -> None:
        for row in rows:
            info = VersionInfo(row.shards, row.fencing_epoch)
            self.record((row.tenant_id, row.group_id), row.version, info)


class _StateSnap(msgspec.Struct, array_like=True, frozen=True):
    """Serialized form of a FanoutState: its GroupMembership bytes, versions and epochs."""

    membership: bytes
    versions: tuple[_Row, ...] = ()
    epochs: tuple[tuple[str, str, U64], ...] = ()


_SNAP_DECODER = msgspec.msgpack.Decoder(_StateSnap)


class FanoutLogError(ValueError):
    """A record no writer of ours produces (a direct message without participants)."""


class NotReadyReason(StrEnum):
    VERSION_UNKNOWN = "membership_version_unknown"
    """The pinned version is above what this state has applied: its membership record (or the
    last chunk of a create) is not in yet. Retry after it, or rebuild the state."""
    VERSION_RETIRED = "membership_version_retired"
    """The pinned version fell out of ``max_retained_versions``: rebuild from an older point."""


@dataclass(frozen=True, slots=True)
class NotReady:
    """A record that cannot be fanned out from this state yet; nothing was changed."""

    tenant_id: str
    conversation_id: str
    message_id: bytes
    membership_version: int
    known_version: int
    reason: NotReadyReason


class FanoutState:
    """Membership replica, retained version shards and per-group fencing maxima."""

    def __init__(self, config: FanoutConfig | None = None) -> None:
        self.config = config or FanoutConfig()
        self.membership = GroupMembership(
            mailbox_shard_count=self.config.mailbox_shard_count,
            virtual_bucket_count=self.config.virtual_bucket_count,
        )
        self._versions = _VersionHistory(self.config.max_retained_versions)
        self._epochs: dict[tuple[str, str], int] = {}

    def apply_outbox(self, record: OutboxRecord) -> list[DispatchLogRecord] | NotReady:
        """Fold one outbox record in (log order); the records to produce, in produce order."""
        if isinstance(record, MessageCommitted | MessageAmended):
            return self._message(record)
        if isinstance(record, MessageReacted):
            return self._reaction(record)
        return self._membership(record)

    # -- messages -------------------------------------------------------------------------------

    def _message(
        self, record: MessageCommitted | MessageAmended
    ) -> list[DispatchLogRecord] | NotReady:
        """A message, or an amend (recipients exactly like a message at its own seq)."""
        tenant = record.tenant_id
        if record.conversation_kind == DIRECT:
            if not record.participants:
                raise FanoutLogError(f"direct message without participants: {record.message_id!r}")
            shards = shards_of(record.participants, lambda u: self.config.shard_of(tenant, u))
        else:
            key = (tenant, record.conversation_id)
            info = self._pinned(key, record.membership_version)
            if isinstance(info, NotReadyReason):
                return self._not_ready(key, record.message_id, record.membership_version, info)
            shards = info.shards
            self._epochs[key] = max(self._epochs.get(key, 0), record.fencing_epoch)
        out: list[DispatchLogRecord] = []
        for shard in shards:
            if isinstance(record, MessageAmended):
                dispatch = amend_dispatch(record, shard)
            else:
                dispatch = message_dispatch(record, shard)
            out.extend(split_event_groups(dispatch, self.config))
        if isinstance(record, MessageAmended) and record.conversation_kind != DIRECT:
            out.extend(self._former_shards(record, set(shards)))
        return out

    def _reaction(self, record: MessageReacted) -> list[DispatchLogRecord]:
        """One ReactionSummary per target shard, never an entry (module docstring)."""
        tenant = record.tenant_id
        if record.conversation_kind == DIRECT:
            shards = shards_of(record.participants, lambda u: self.config.shard_of(tenant, u))
        else:
            key = (tenant, record.conversation_id)
            info = self._pinned(key, record.membership_version)
            if isinstance(info, NotReadyReason):
                return []
            shards = info.shards
        return [
            ReactionSummary(
                tenant_id=tenant,
                conversation_id=record.conversation_id,
                message_id=record.target_message_id,
                conversation_seq=record.target_conversation_seq,
                counts=dict(sorted(record.counts.items())),
                summary_version=record.summary_version,
                target_mailbox_shard=shard,
                committed_at=record.committed_at,
            )
            for shard in shards
        ]

    def _former_shards(self, record: MessageAmended, current: set[int]) -> list[GroupDispatch]:
        """A recall / edit also reaches the shards where only former members are (of a
        retained version): their entries of the target keep its body copy, which must not be
        served again (13.4). Explicit recipients only (version 0, none): no entry, no slice
        needed, only the shard's copies are rewritten. A version evicted from the history is
        not seen (``max_retained_versions``)."""
        key = (record.tenant_id, record.conversation_id)
        extra = sorted(self._versions.shards_through(key, record.membership_version) - current)
        return [
            msgspec.structs.replace(
                amend_dispatch(record, shard), membership_version=0, participants=()
            )
            for shard in extra
        ]

    def _pinned(self, key: tuple[str, str], version: int) -> VersionInfo | NotReadyReason:
        if version < 1 or version > self.membership.version(*key):
            return NotReadyReason.VERSION_UNKNOWN
        info = self._versions.get(key, version)
        return NotReadyReason.VERSION_RETIRED if info is None else info

    def _not_ready(
        self, key: tuple[str, str], message_id: bytes, version: int, reason: NotReadyReason
    ) -> NotReady:
        known = self.membership.version(*key)
        return NotReady(key[0], key[1], message_id, version, known, reason)

    # -- membership -----------------------------------------------------------------------------

    def _membership(self, record: MembershipCommitted) -> list[DispatchLogRecord] | NotReady:
        key = (record.tenant_id, record.group_id)
        known = self.membership.version(*key)
        if record.action != MembershipAction.CREATE and record.membership_version > known + 1:
            # the group's create or an earlier change is not in yet: behind the log, not bad data
            reason = NotReadyReason.VERSION_UNKNOWN
            return self._not_ready(key, record.message_id, record.membership_version, reason)
        published = self.membership.apply(record)
        if published is not None:
            group = self.membership.group(*key)
            if group is None:  # pragma: no cover - apply publishes only existing groups
                raise FanoutLogError(f"version {published} of a group that does not exist")
            # MembershipCommitted has no fencing_epoch yet: stamp the group's highest so far
            epoch: int | None = getattr(record, "fencing_epoch", None)
            stamp = self._epochs.get(key, 0) if epoch is None else epoch
            version = VersionInfo(tuple(group.shards()), stamp)
            self._versions.record(key, published.membership_version, version)
        if record.conversation_seq < 1:
            return []  # an earlier chunk of a create (the last one carries its CONTROL message)
        info = self._pinned(key, record.membership_version)
        if isinstance(info, NotReadyReason):
            return self._not_ready(key, record.message_id, record.membership_version, info)
        return list(self._control_dispatches(record, info))

    def _control_dispatches(
        self, record: MembershipCommitted, info: VersionInfo
    ) -> list[GroupDispatch]:
        tenant = record.tenant_id
        subjects: dict[int, list[str]] = {}
        broadcast = self.config.broadcasts(record.member_count)
        users = record.targets
        if record.previous_owner:  # a transfer: the previous owner's role changes too
            users = (*record.targets, record.previous_owner)
        if record.action == MembershipAction.CREATE:
            # the creator and the invitees join (10.1.3, 12.9): all are subjects, nobody is
            # left for a broadcast. From the record alone, so a redelivery is identical; a
            # create of more than one chunk (> 4096 members) reaches the creator and its last
            # chunk's invitees only (the earlier chunks carry no CONTROL message).
            users = (record.actor, *record.targets)
            broadcast = False
        for user in sorted(users):
            subjects.setdefault(self.config.shard_of(tenant, user), []).append(user)
        shards = sorted(set(subjects) | set(info.shards if broadcast else ()))
        out: list[GroupDispatch] = []
        for shard in shards:
            dispatch = membership_dispatch(
                record,
                shard,
                subjects=tuple(subjects.get(shard, ())),
                broadcast=broadcast,
                fencing_epoch=info.fencing_epoch,
            )
            out.extend(split_event_groups(dispatch, self.config))
        return out

    # -- deterministic serialization -----------------------------------------------------------

    def encode(self) -> bytes:
        """Canonical bytes of the whole state (membership, retained versions, epochs)."""
        epochs = tuple((t, c, e) for (t, c), e in sorted(self._epochs.items()))
        snap = _StateSnap(self.membership.encode(), self._versions.rows(), epochs)
        return _ENCODER.encode(snap)

    @classmethod
    def seeded(
        cls,
        membership: GroupMembership,
        current: Iterable[tuple[GroupKey, int, VersionInfo]],
        epochs: Iterable[tuple[GroupKey, int]],
        config: FanoutConfig | None = None,
    ) -> FanoutState:
        """A state that knows only each group's ``current`` version (a checkpoint's view).

        Why: the fanout seeds itself from the writer's checkpoint, which holds the membership
        and each group's highest fencing epoch but no older versions; records after the
        checkpoint can only pin the current one.
        """
        state = cls(config)
        state.membership = membership
        for key, version, info in sorted(current, key=lambda item: (item[0], item[1])):
            state._versions.record(key, version, info)
        state._epochs = dict(sorted(epochs))
        return state

    @classmethod
    def decode(cls, data: bytes, config: FanoutConfig | None = None) -> FanoutState:
        """Inverse of :meth:`encode` under ``config`` (routing must be the encoding one's)."""
        config = config or FanoutConfig()
        snap = _SNAP_DECODER.decode(data)
        state = cls(config)
        state.membership = GroupMembership.decode(
            snap.membership,
            mailbox_shard_count=config.mailbox_shard_count,
            virtual_bucket_count=config.virtual_bucket_count,
        )
        state._versions.restore(snap.versions)
        state._epochs = {(t, c): e for t, c, e in snap.epochs}
        return state
