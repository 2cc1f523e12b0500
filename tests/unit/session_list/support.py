"""A small reference world for the session-list core: conversations, a shard log, a store.

:class:`World` plays ConversationWriter + FanoutCoordinator + MailboxNode for ONE user ``U``:
it allocates ``conversation_seq`` / ``last_activity_id`` per commit, appends the user's mailbox
inputs (A.4.1 entries and ``StateIn`` records) in log order, and keeps a log-consistent message
store (:class:`MemorySource`). Tests fold ``world.log`` and compare against
``unread_formula`` evaluated over ``world.store`` with the final state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from qim.core.session_list import (
    EntryIn,
    Join,
    Leave,
    MessageFacts,
    StateIn,
    UserChange,
    UserConversationState,
    apply_change,
)
from qim.schemas.frames.base import EntryFlags, EventType, MentionType, u128_to_bytes
from qim.schemas.frames.mailbox import SyncEntry

U = "u"
ORDER = int(EntryFlags.AFFECTS_SESSION_ORDER)
VISIBLE = int(EntryFlags.TIMELINE_VISIBLE)
COUNTS = int(EntryFlags.COUNTS_UNREAD)


@dataclass
class StoredFact:
    conversation_id: str
    facts: MessageFacts
    appeared_at: int
    removed_at: int | None = None
    flags_for_u: int = 0


@dataclass
class MemorySource:
    """``MessageSource`` over the world's store, honouring ``as_of_mailbox_seq``; counts reads."""

    rows: dict[str, dict[int, StoredFact]] = field(default_factory=dict)
    reads: list[int] = field(default_factory=list)

    def read_range(
        self,
        conversation_id: str,
        after_seq: int,
        upto_seq: int,
        limit: int,
        as_of_mailbox_seq: int,
    ) -> Sequence[MessageFacts]:
        out: list[MessageFacts] = []
        for seq in sorted(self.rows.get(conversation_id, {})):
            stored = self.rows[conversation_id][seq]
            if not after_seq < seq <= upto_seq or stored.appeared_at > as_of_mailbox_seq:
                continue
            removed = stored.removed_at is not None and stored.removed_at <= as_of_mailbox_seq
            f = stored.facts
            out.append(
                MessageFacts(
                    f.conversation_seq, f.sender_id, f.counts_unread, f.mention_type, removed
                )
            )
            if len(out) == limit:
                break
        self.reads.append(len(out))
        return out

    def final_facts(self, conversation_id: str) -> list[MessageFacts]:
        """Every stored message with its final removed flag (the formula's input)."""
        out = []
        for seq in sorted(self.rows.get(conversation_id, {})):
            s = self.rows[conversation_id][seq]
            f = s.facts
            out.append(
                MessageFacts(
                    f.conversation_seq,
                    f.sender_id,
                    f.counts_unread,
                    f.mention_type,
                    s.removed_at is not None,
                )
            )
        return out


@dataclass
class Held:
    conversation_id: str
    seq: int
    activity: int
    sender: str
    counts_unread: bool
    mention: int
    to_user: bool
    floor: int


@dataclass
class World:
    conversations: tuple[str, ...] = ("c1", "c2", "c3")
    heads: dict[str, int] = field(default_factory=dict)
    states: dict[str, UserConversationState] = field(default_factory=dict)
    store: MemorySource = field(default_factory=MemorySource)
    log: list[EntryIn | StateIn] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    activity: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        for c in self.conversations:
            self.heads.setdefault(c, 0)
            self.states.setdefault(c, UserConversationState(conversation_id=c))

    # -- allocation ------------------------------------------------------------------------
    def _commit(self, conv: str) -> tuple[int, int]:
        self.heads[conv] += 1
        self.activity += 1
        return self.heads[conv], self.activity

    def _next_offset(self) -> int:
        self.offset += 1
        return self.offset

    def member_at(self, conv: str, seq: int) -> bool:
        s = self.states[conv]
        return s.joined_at_conversation_seq < seq and s.left_at_conversation_seq is None

    # -- operations ------------------------------------------------------------------------
    def send(
        self,
        conv: str,
        sender: str,
        *,
        counts_unread: bool = True,
        mention: int = MentionType.NONE,
        late: bool = False,
        stray: bool = False,
    ) -> int:
        """Commit and deliver; ``stray`` also hands it to ``U`` outside the member expansion
        (a replayed / late entry the consumer-side bound must ignore, 12.10)."""
        seq, activity = self._commit(conv)
        # the member expansion is decided at commit, by the version the message pins (10.1)
        floor = self.states[conv].joined_at_conversation_seq
        msg = Held(
            conv,
            seq,
            activity,
            sender,
            counts_unread,
            mention,
            stray or self.member_at(conv, seq),
            floor,
        )
        if late:
            self.held.append(msg)
        else:
            self._deliver(msg)
        return seq

    def deliver_held(self, index: int = 0) -> None:
        self._deliver(self.held.pop(index))

    def _deliver(self, msg: Held) -> None:
        m = self._next_offset()
        own = msg.sender == U
        flags = ORDER | VISIBLE | (COUNTS if msg.counts_unread and not own else 0)
        mention = MentionType.NONE if own else msg.mention
        facts = MessageFacts(msg.seq, msg.sender, msg.counts_unread, mention)
        self.store.rows.setdefault(msg.conversation_id, {})[msg.seq] = StoredFact(
            msg.conversation_id, facts, m, flags_for_u=flags
        )
        if msg.to_user:
            self.log.append(
                EntryIn(
                    SyncEntry(
                        mailbox_seq=m,
                        event_ordinal=EventType.MESSAGE,
                        event_id=m * 10,
                        event_type=EventType.MESSAGE,
                        message_id=u128_to_bytes(1000 + msg.activity),
                        conversation_id=msg.conversation_id,
                        conversation_seq=msg.seq,
                        last_activity_id=u128_to_bytes(msg.activity),
                        sender_id=msg.sender,
                        visibility_floor_conversation_seq=msg.floor,
                        flags=flags,
                        mention_type=mention,
                    )
                )
            )

    def recall(
        self, conv: str, target: int, *, by: str = "a", edit: bool = False, dup: bool = False
    ) -> None:
        """A recall CONTROL (own seq, no order/unread flags) removing ``target``; ``edit``: an
        edit CONTROL instead (same anchor, removes nothing); ``dup``: the entry is delivered
        twice in a row (a redelivery: the same mailbox key)."""
        stored = self.store.rows[conv][target]
        assert stored.removed_at is None
        seq, activity = self._commit(conv)
        m = self._next_offset()
        if not edit:
            stored.removed_at = m
        if not self.member_at(conv, seq):
            return
        for _ in range(2 if dup else 1):
            self._control(conv, (seq, activity, m, target), by, stored, not edit)

    def _control(
        self, conv: str, at: tuple[int, int, int, int], by: str, stored: StoredFact, removes: bool
    ) -> None:
        seq, activity, m, target = at
        f = stored.facts
        self.log.append(
            EntryIn(
                SyncEntry(
                    mailbox_seq=m,
                    event_ordinal=EventType.CONTROL,
                    event_id=m * 10 + 3,
                    event_type=EventType.CONTROL,
                    message_id=u128_to_bytes(1000 + activity),
                    conversation_id=conv,
                    conversation_seq=seq,
                    last_activity_id=u128_to_bytes(activity),
                    sender_id=by,
                    flags=0,
                    target_conversation_seq=target,
                    target_sender_id=f.sender_id,
                    target_flags=stored.flags_for_u,
                    target_mention_type=f.mention_type,
                ),
                removes_target=removes,
            )
        )

    def change(self, conv: str, change: UserChange) -> None:
        """A user action / membership record in the shard log, as the StateIn it produces."""
        m = self._next_offset()
        new = apply_change(self.states[conv], change, activity_id=self.activity)
        self.states[conv] = new
        self.log.append(StateIn(mailbox_seq=m, event_id=m * 10 + 3, state=new))

    def leave(self, conv: str) -> None:
        seq, _ = self._commit(conv)
        self.change(conv, Leave(seq))

    def join(self, conv: str) -> None:
        seq, activity = self._commit(conv)
        self.change(conv, Join(seq))
        m = self._next_offset()
        self.log.append(
            EntryIn(
                SyncEntry(
                    mailbox_seq=m,
                    event_ordinal=EventType.MEMBERSHIP,
                    event_id=m * 10 + 2,
                    event_type=EventType.MEMBERSHIP,
                    message_id=u128_to_bytes(1000 + activity),
                    conversation_id=conv,
                    conversation_seq=seq,
                    last_activity_id=u128_to_bytes(activity),
                    sender_id=U,
                    visibility_floor_conversation_seq=seq - 1,
                    flags=ORDER | VISIBLE,
                )
            )
        )

    def flush_held(self) -> None:
        while self.held:
            self.deliver_held()
