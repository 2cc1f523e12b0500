"""Test doubles around the FanoutCoordinator core: a writer-like outbox and an independent model.

:class:`Outbox` plays the ConversationWriter: it keeps its own ``GroupMembership`` (as the
writer does), allocates the CONTROL message's seq only when a membership operation returns a
record, pins the current version into every group message, and publishes each new version's
member slices (``slices``, as ``qim.agents.writer.partition`` does). Its ``log`` is the outbox;
:func:`pipeline` interleaves both producers into the dispatch log.

:class:`IntervalModel` is the reference the end-to-end tests compare against. It never touches
``GroupMembership``, slices or dispatches: it folds the same outbox into plain per-user interval
lists (spec 7.5: ``joined_at = J - 1`` for a join at J, ``left_at = J`` for a leave at J, 0 for
creation, whose stamped last chunk reaches the creator and its invitees as MEMBERSHIP) and answers
"who receives the event at seq s" from those alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qim.core.conversation.ids import direct_conversation_id, direct_participants
from qim.core.fanout import Delivery, FanoutState, NotReady, expand_dispatch
from qim.core.membership import (
    ControlStamp,
    GroupMembership,
    ShardSlice,
    SliceAssembler,
    add_members,
    create_group,
    dissolve_group,
    leave_group,
    member_slices,
    remove_members,
    set_role,
    transfer_ownership,
)
from qim.schemas.events import EventType
from qim.schemas.frames.base import MENTION_ALL, MentionType
from qim.schemas.ids import message_id_to_bytes
from qim.schemas.records.dispatch import DispatchLogRecord, GroupDispatch
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MembershipAction,
    MembershipCommitted,
    MemberSliceRecord,
    decode_control,
)
from qim.schemas.records.outbox import (
    DIRECT,
    GROUP,
    MessageAmended,
    MessageCommitted,
    MessageReacted,
    OutboxRecord,
)
from qim.schemas.routing import mailbox_shard_id, user_bucket

T = "t1"
MAX_MEMBERS = 100_000


def shard_of(user: str, shards: int, tenant: str = T) -> int:
    return mailbox_shard_id(user_bucket(tenant, user), shards)


class Outbox:
    """A ConversationWriter double: its membership, its seqs, and the outbox it appends to."""

    def __init__(self, *, shards: int = 64, tenant: str = T) -> None:
        self.tenant = tenant
        self.membership = GroupMembership(mailbox_shard_count=shards)
        self.log: list[OutboxRecord] = []
        self.slices: dict[int, tuple[MemberSliceRecord, ...]] = {}
        """Log position -> the member slices the writer published with that record."""
        self.seqs: dict[str, int] = {}
        self.clock = 1_700_000_000_000
        self.serial = 0

    def _next(self, conversation: str) -> tuple[int, int, int]:
        """(seq, message_id, committed_at) of the next event of ``conversation``."""
        seq = self.seqs.get(conversation, 0) + 1
        self.seqs[conversation] = seq
        self.clock += 1
        self.serial += 1
        return seq, (self.clock << 32) | self.serial, self.clock

    def _commit(self, records: Iterable[MembershipCommitted]) -> None:
        """Append and apply, and publish the version's slices as the writer does (same txn)."""
        for record in records:
            self.log.append(record)
            published = self.membership.apply(record)
            group = self.membership.group(record.tenant_id, record.group_id)
            if published is not None and group is not None:
                self.slices[len(self.log) - 1] = member_slices(group, published)

    def _stamp(self, group: str) -> ControlStamp:
        seq, mid, at = self._next(group)
        return ControlStamp(seq, message_id=mid, last_activity_id=mid, committed_at=at)

    def create(self, group: str, creator: str, invitees: Iterable[str], chunk: int = 4096) -> None:
        self.clock += 1
        self._commit(
            create_group(
                self.membership,
                tenant_id=self.tenant,
                group_id=group,
                creator=creator,
                invitees=invitees,
                committed_at=self.clock,
                max_members=MAX_MEMBERS,
                chunk_max_members=chunk,
                stamp=self._stamp(group),  # the create is the group's first CONTROL message
            )
        )

    def add(self, group: str, users: Iterable[str]) -> MembershipCommitted | None:
        users = list(users)
        if not any(not self.membership.is_member(self.tenant, group, u) for u in users):
            return None
        record = add_members(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            actor="admin",
            targets=users,
            stamp=self._stamp(group),
            max_members=MAX_MEMBERS,
        )
        self._commit([record] if record else [])
        return record

    def remove(self, group: str, users: Iterable[str], *, ban: bool = False) -> None:
        users = [u for u in users if self.membership.is_member(self.tenant, group, u)]
        if not users:
            return
        stamp = self._stamp(group)
        record = remove_members(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            actor="admin",
            targets=users,
            stamp=stamp,
            ban=ban,
        )
        self._commit([record] if record else [])

    def leave(self, group: str, user: str) -> MembershipCommitted:
        record = leave_group(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            user_id=user,
            stamp=self._stamp(group),
        )
        self._commit([record])
        return record

    def set_role(self, group: str, owner: str, user: str, role: str) -> MembershipCommitted:
        record = set_role(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            actor=owner,
            targets=[user],
            role=role,
            stamp=self._stamp(group),
            as_member=True,
        )
        assert record is not None
        self._commit([record])
        return record

    def transfer(self, group: str, owner: str, new_owner: str) -> MembershipCommitted:
        record = transfer_ownership(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            actor=owner,
            new_owner=new_owner,
            stamp=self._stamp(group),
            as_member=True,
        )
        self._commit([record])
        return record

    def dissolve(self, group: str, owner: str) -> MembershipCommitted:
        record = dissolve_group(
            self.membership,
            tenant_id=self.tenant,
            group_id=group,
            actor=owner,
            stamp=self._stamp(group),
            as_member=True,
        )
        self._commit([record])
        return record

    def send(
        self,
        group: str,
        sender: str,
        *,
        mentions: tuple[str, ...] = (),
        payload: bytes = b"hello",
        inline: bool = False,
        fencing_epoch: int = 0,
    ) -> MessageCommitted:
        seq, mid, at = self._next(group)
        record = MessageCommitted(
            tenant_id=self.tenant,
            conversation_id=group,
            conversation_kind=GROUP,
            message_id=message_id_to_bytes(mid),
            conversation_seq=seq,
            last_activity_id=message_id_to_bytes(mid),
            sender_id=sender,
            origin_device_id="dev-1",
            client_message_id=f"c-{mid}",
            payload=payload,
            mention_targets=mentions,
            membership_version=self.membership.version(self.tenant, group),
            member_count=self.membership.member_count(self.tenant, group),
            committed_at=at,
            inline_body=inline,
            fencing_epoch=fencing_epoch,
        )
        self.log.append(record)
        return record

    def direct(self, sender: str, peer: str, *, message_id: int | None = None) -> MessageCommitted:
        conversation = direct_conversation_id(self.tenant, sender, peer)
        seq, mid, at = self._next(conversation)
        mid = mid if message_id is None else message_id
        participants = direct_participants(sender, peer)
        record = MessageCommitted(
            tenant_id=self.tenant,
            conversation_id=conversation,
            conversation_kind=DIRECT,
            participants=participants,
            message_id=message_id_to_bytes(mid),
            conversation_seq=seq,
            last_activity_id=message_id_to_bytes(mid),
            sender_id=sender,
            origin_device_id="dev-1",
            member_count=len(participants),
            committed_at=at,
        )
        self.log.append(record)
        return record


def created_group(d: GroupDispatch) -> bool:
    """The MEMBERSHIP dispatch of a group's create (its initial members' entries)."""
    if d.event_type != EventType.MEMBERSHIP or d.custom_type != MEMBERSHIP_CUSTOM_TYPE:
        return False
    return decode_control(d.payload).action == MembershipAction.CREATE


def after_create(produced: Iterable[DispatchLogRecord]) -> list[GroupDispatch]:
    """The group dispatches of ``produced`` other than a create's."""
    return [d for d in produced if isinstance(d, GroupDispatch) and not created_group(d)]


def pipeline(outbox: Outbox, state: FanoutState) -> list[DispatchLogRecord]:
    """The dispatch log as writer + FanoutCoordinator produce it: each outbox record's slices
    (committed with it) and then the coordinator's dispatches for it."""
    out: list[DispatchLogRecord] = []
    for position, record in enumerate(outbox.log):
        out.extend(outbox.slices.get(position, ()))
        out.extend(run(state, [record]))
    return out


def run(state: FanoutState, log: Sequence[OutboxRecord]) -> list[DispatchLogRecord]:
    """Apply ``log`` in order; every record must be ready."""
    out: list[DispatchLogRecord] = []
    for record in log:
        produced = state.apply_outbox(record)
        assert not isinstance(produced, NotReady), produced
        out.extend(produced)
    return out


def delivered(
    produced: Iterable[DispatchLogRecord], shards: int, tenant: str = T
) -> dict[bytes, set[Delivery]]:
    """message_id -> every entry the MailboxNodes write, replaying each partition in order
    (with the departures each shard's completed slices told it, as the MailboxNode keeps)."""
    assembler = SliceAssembler()
    slices: dict[tuple[str, int, int], ShardSlice] = {}
    departures: dict[tuple[str, int], dict[tuple[str, int], int]] = {}
    out: dict[bytes, set[Delivery]] = {}
    for record in produced:
        if isinstance(record, MemberSliceRecord):
            done = assembler.apply(record)
            if done is not None:
                slices[(done.group_id, done.membership_version, done.mailbox_shard)] = done
                known = departures.setdefault((done.group_id, done.mailbox_shard), {})
                for user, joined_at, left_at in done.left:
                    known.setdefault((user, joined_at), left_at)
            continue
        if not isinstance(record, GroupDispatch):
            continue  # a reaction summary writes no entry
        shard = record.target_mailbox_shard
        key = (record.conversation_id, record.membership_version, shard)
        entries = expand_dispatch(
            record,
            slices.get(key),
            lambda u: shard_of(u, shards, tenant),
            departures=departures.get((record.conversation_id, shard), {}),
        )
        out.setdefault(record.message_id, set()).update(entries)
    return out


class IntervalModel:
    """Reference "who receives" from intervals alone (module docstring)."""

    def __init__(self, broadcast_max_members: int = 500) -> None:
        self.broadcast_max = broadcast_max_members
        self.intervals: dict[str, list[list[int | None]]] = {}
        self.expected: dict[bytes, set[Delivery]] = {}

    def _visible(self, user: str, seq: int) -> bool:
        return any(
            lo is not None and lo < seq and (hi is None or seq < hi)
            for lo, hi in self.intervals.get(user, [])
        )

    def _members_at(self, seq: int) -> list[str]:
        return sorted(u for u in self.intervals if self._visible(u, seq))

    def fold(self, record: OutboxRecord) -> None:
        if isinstance(record, MessageCommitted | MessageAmended):
            if record.conversation_kind == DIRECT:
                users = list(record.participants)
            else:
                users = self._members_at(record.conversation_seq)
            if isinstance(record, MessageAmended):  # a CONTROL entry per recipient (13.4.1)
                self.expected[record.message_id] = {Delivery(u, EventType.CONTROL) for u in users}
                return
            self.expected[record.message_id] = {
                Delivery(u, EventType.MESSAGE, _mention(record.mention_targets, u)) for u in users
            }
            return
        if isinstance(record, MessageReacted):
            return  # a reaction is no mailbox entry (13.6.1)
        seq = record.conversation_seq
        if record.action == MembershipAction.CREATE:
            joined = [record.actor] if record.chunk_index == 0 else []
            for user in [*joined, *record.targets]:
                self.intervals.setdefault(user, []).append([0, None])
            if seq >= 1:  # the stamped last chunk: the creator's and its invitees' entries
                created = {record.actor, *record.targets}
                self.expected[record.message_id] = {
                    Delivery(u, EventType.MEMBERSHIP) for u in created
                }
            return
        if record.action == MembershipAction.ADD:
            for user in record.targets:
                self.intervals.setdefault(user, []).append([seq - 1, None])
        else:
            for user in record.targets:
                self.intervals[user][-1][1] = seq
        subjects = set(record.targets)
        entries = {Delivery(u, EventType.MEMBERSHIP) for u in subjects}
        if record.member_count <= self.broadcast_max:
            others = [u for u in self._members_at(seq) if u not in subjects]
            entries |= {Delivery(u, EventType.MESSAGE) for u in others}
        self.expected[record.message_id] = entries


def _mention(targets: tuple[str, ...], user: str) -> int:
    if user in targets:
        return MentionType.AT_ME
    return MentionType.AT_ALL if MENTION_ALL in targets else MentionType.NONE
