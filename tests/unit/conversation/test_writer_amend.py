"""RECALL / EDIT decisions of the writer core (spec 13.4, AT-12..14, AT-61, AT-62, INV-35)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest

from qim.core.conversation import (
    Amended,
    ApplyOutcome,
    Duplicate,
    Rejected,
    direct_conversation_id,
    replay,
)
from qim.core.history import (
    MemoryOrderedStore,
    MessageRecord,
    MessageState,
    archive_batch,
    decode_message_record,
    encode_message_record,
    message_key,
    write_all,
)
from qim.schemas.frames.base import EntryFlags
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import AmendRequest
from qim.schemas.records.outbox import (
    MessageAmended,
    MessageCommitted,
    OutboxRecord,
    PreviewPlaceholder,
)
from tests.unit.conversation.support import (
    NOW,
    REGION,
    TENANT,
    WRITER,
    Groups,
    accepted,
    config,
    direct_request,
    send_request,
    writer,
)

G = "g:team"
MINUTE = 60_000


@dataclass
class AdminGroups(Groups):
    """``Groups`` plus OWNER/ADMIN roles (the amend path's extra question)."""

    admins: set[tuple[str, str, str]] = field(default_factory=set)

    def is_admin(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        return (tenant_id, conversation_id, user_id) in self.admins


class Conversation:
    """A writer, its MessageStore and its log: the shell's loop without Kafka."""

    def __init__(self, **limits: object) -> None:
        self.cfg = config(**limits)
        self.w = writer(self.cfg)
        self.groups = AdminGroups()
        self.groups.add(G, {"ann", "bob", "cat"})
        self.groups.admins.add((TENANT, G, "cat"))
        self.store = MemoryOrderedStore()
        self.log: list[OutboxRecord] = []
        self.participants: tuple[str, ...] | None = None

    def commit(self, record: OutboxRecord) -> None:
        assert self.w.apply(record) is ApplyOutcome.APPLIED
        self.log.append(record)
        write_all(self.store, archive_batch([record], read=self.store.get))

    def send(self, sender: str, cmid: str, *, at: int = NOW, payload: bytes = b"hi") -> int:
        request = send_request(sender, G, cmid, payload=payload)
        record = accepted(self.w.handle_send(request, at, self.groups)).record
        self.commit(record)
        return record.conversation_seq

    def row(self, seq: int, conversation_id: str = G) -> MessageRecord | None:
        raw = self.store.get(message_key(TENANT, conversation_id, seq))
        return None if raw is None else decode_message_record(raw)

    def decide(
        self,
        user: str,
        seq: int,
        action: str = "recall",
        *,
        at: int = NOW,
        payload: bytes = b"",
        conversation_id: str = G,
    ) -> Rejected | Duplicate | Amended:
        request = AmendRequest(
            tenant_id=TENANT,
            user_id=user,
            device_id="phone",
            session_epoch=7,
            connection_shard=3,
            request_id=9,
            action="recall" if action == "recall" else "edit",
            conversation_id=conversation_id,
            target_conversation_seq=seq,
            new_payload=payload,
        )
        before = self.w.snapshot()
        decision = self.w.handle_amend(
            request,
            at,
            self.groups,
            lambda s: self.row(s, conversation_id),
            participants=self.participants,
        )
        assert self.w.snapshot() == before  # decide, never mutate
        return decision

    def amend(self, user: str, seq: int, action: str = "recall", **kw: object) -> MessageAmended:
        decision = self.decide(user, seq, action, **kw)  # type: ignore[arg-type]
        assert isinstance(decision, Amended), decision
        self.commit(decision.record)
        return decision.record


def _code(decision: object) -> ErrorCode:
    assert isinstance(decision, Rejected), decision
    return decision.code


def test_13_4_1_recall_gets_its_own_seq_and_acks_the_control_event() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    decision = c.decide("ann", seq, at=NOW + 1000)
    assert isinstance(decision, Amended)
    record, ack = decision.record, decision.reply.send_ack
    assert ack is not None and ack.client_message_id == ""
    assert (ack.message_id, ack.conversation_seq, ack.last_activity_id) == (
        record.message_id,
        seq + 1,
        record.last_activity_id,
    )
    row = c.row(seq)
    assert row is not None
    assert record.action == "recall" and record.sender_id == "ann"
    assert (record.target_message_id, record.target_conversation_seq) == (row.message_id, seq)
    assert record.target_sender_id == "ann" and record.new_payload == b""
    all_flags = EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER
    assert record.target_flags == int(all_flags | EntryFlags.TIMELINE_VISIBLE)
    assert (record.membership_version, record.member_count) == (1, 3)
    placeholder = msgspec.msgpack.decode(record.preview_or_placeholder, type=PreviewPlaceholder)
    assert placeholder == PreviewPlaceholder(message_type=1, state="recalled")


def test_13_4_3_rejections_in_order_allocate_nothing() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    assert _code(c.decide("zed", seq)) == ErrorCode.PERMISSION_DENIED  # not a member
    assert _code(c.decide("ann", seq + 5)) == ErrorCode.PERMISSION_DENIED  # no such target
    assert _code(c.decide("bob", seq)) == ErrorCode.PERMISSION_DENIED  # not the sender
    assert _code(c.decide("cat", seq, "edit", payload=b"x")) == ErrorCode.PERMISSION_DENIED
    control = c.amend("ann", seq, "edit", payload=b"v2").conversation_seq
    assert _code(c.decide("ann", control)) == ErrorCode.PERMISSION_DENIED  # an amend CONTROL
    big = b"x" * (c.cfg.limits.max_custom_payload_bytes + 1)
    assert _code(c.decide("ann", seq, "edit", payload=big)) == ErrorCode.PAYLOAD_TOO_LARGE
    assert _code(c.decide("bob", seq, "edit", payload=big)) == ErrorCode.PERMISSION_DENIED
    head = c.w.head(TENANT, G)
    assert head is not None and head.latest_conversation_seq == control


@pytest.mark.parametrize(("action", "window"), [("recall", 2 * MINUTE), ("edit", 15 * MINUTE)])
def test_at_61_window_edges_measured_from_committed_at(action: str, window: int) -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    row = c.row(seq)
    assert row is not None and row.created_at == NOW
    late = c.decide("ann", seq, action, at=NOW + window + 1, payload=b"v2")
    assert _code(late) == ErrorCode.PERMISSION_DENIED
    assert isinstance(c.decide("ann", seq, action, at=NOW + window, payload=b"v2"), Amended)


def test_13_4_3_window_uses_log_time_not_a_clock_gone_back() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    c.send("bob", "m2", at=NOW + 3 * MINUTE)  # the HLC is now 3 min past the target
    assert _code(c.decide("ann", seq, at=NOW)) == ErrorCode.PERMISSION_DENIED


def test_at_61_admin_recalls_anyones_old_message_but_edits_only_own() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    three_days = NOW + 3 * 24 * 60 * MINUTE
    assert _code(c.decide("cat", seq, "edit", at=NOW, payload=b"x")) == ErrorCode.PERMISSION_DENIED
    record = c.amend("cat", seq, at=three_days)
    assert record.sender_id == "cat" and record.target_sender_id == "ann"
    row = c.row(seq)
    assert row is not None and row.state == MessageState.RECALLED


def test_13_4_edit_after_recall_refused_recall_after_edit_allowed() -> None:
    c = Conversation()
    first, second = c.send("ann", "m1"), c.send("ann", "m2")
    c.amend("ann", first)
    assert _code(c.decide("ann", first, "edit", payload=b"x")) == ErrorCode.PERMISSION_DENIED
    edit = c.amend("ann", second, "edit", payload=b"v2")
    assert edit.new_payload == b"v2" and edit.preview_or_placeholder == b"v2"
    row = c.row(second)
    assert row is not None and row.recall_event_conversation_seq == edit.conversation_seq
    recall = c.amend("ann", second)  # an edited message is still recallable (AT-14)
    row = c.row(second)
    assert row is not None and row.state == MessageState.RECALLED
    assert row.recall_event_conversation_seq == recall.conversation_seq


def test_at_62_second_recall_answers_the_first_and_appends_nothing() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    first = c.amend("ann", seq)
    again = c.decide("ann", seq)
    assert isinstance(again, Duplicate)
    ack = again.reply.send_ack
    assert ack is not None
    assert (ack.message_id, ack.conversation_seq, ack.last_activity_id) == (
        first.message_id,
        first.conversation_seq,
        first.last_activity_id,
    )
    by_admin = c.decide("cat", seq)  # any actor: the recall is already in the log
    assert isinstance(by_admin, Duplicate)


def test_inv_35_short_circuit_keys_on_the_event_seq_not_on_state() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    row = c.row(seq)
    assert row is not None
    # a state written without the event coordinate (the crash window INV-35 is about)
    half = msgspec.structs.replace(row, state=MessageState.RECALLED)
    c.store.put(message_key(TENANT, G, seq), encode_message_record(half))
    decision = c.decide("ann", seq)
    assert isinstance(decision, Amended)  # not short-circuited: the event is appended
    assert decision.record.conversation_seq == seq + 1


def test_at_12_at_14_preview_repair_keeps_position_fields_of_the_message() -> None:
    c = Conversation()
    c.send("bob", "m0")
    seq = c.send("ann", "m1")
    before = c.w.head(TENANT, G)
    assert before is not None
    edit = c.amend("ann", seq, "edit", payload=b"v2")
    assert edit.repairs_preview
    head = c.w.head(TENANT, G)
    assert head is not None
    assert head.last_message_id == before.last_message_id
    assert head.last_sender_id == "ann"
    assert head.latest_conversation_seq == edit.conversation_seq  # decision: it occupies a seq
    assert head.last_activity_id == edit.last_activity_id
    preview = msgspec.msgpack.decode(head.preview_or_placeholder, type=PreviewPlaceholder)
    assert preview == PreviewPlaceholder(message_type=1, state="edited")
    recall = c.amend("ann", seq)  # AT-14: still the preview, so repaired again
    assert recall.repairs_preview
    head = c.w.head(TENANT, G)
    assert head is not None and head.last_message_id == before.last_message_id
    preview = msgspec.msgpack.decode(head.preview_or_placeholder, type=PreviewPlaceholder)
    assert preview.state == "recalled"


def test_at_13_recall_of_an_older_message_leaves_the_preview() -> None:
    c = Conversation()
    old = c.send("ann", "m1")
    c.send("bob", "m2")
    before = c.w.head(TENANT, G)
    assert before is not None
    record = c.amend("cat", old)
    assert not record.repairs_preview
    head = c.w.head(TENANT, G)
    assert head is not None
    assert head.preview_or_placeholder == before.preview_or_placeholder
    assert (head.last_message_id, head.last_sender_id) == (before.last_message_id, "bob")


def test_direct_conversation_needs_a_remembered_participant() -> None:
    c = Conversation()
    conversation = direct_conversation_id(TENANT, "ann", "bob")
    record = accepted(c.w.handle_send(direct_request("ann", "bob", "d1"), NOW, c.groups)).record
    c.commit(record)
    seq = record.conversation_seq
    assert _code(c.decide("ann", seq, conversation_id=conversation)) == ErrorCode.PERMISSION_DENIED
    c.participants = record.participants
    assert _code(c.decide("zed", seq, conversation_id=conversation)) == ErrorCode.PERMISSION_DENIED
    assert _code(c.decide("bob", seq, conversation_id=conversation)) == ErrorCode.PERMISSION_DENIED
    amended = c.amend("ann", seq, conversation_id=conversation)
    assert amended.conversation_kind == "direct" and amended.participants == ("ann", "bob")


def test_replayed_log_equals_the_live_state() -> None:
    c = Conversation()
    seq = c.send("ann", "m1")
    c.amend("ann", seq, "edit", payload=b"v2")
    c.amend("ann", seq)
    c.send("bob", "m2")
    rebuilt = replay(c.log, c.cfg, region_id=REGION, writer_id=WRITER)
    assert rebuilt.snapshot() == c.w.snapshot()
    assert isinstance(c.log[1], MessageAmended) and isinstance(c.log[-1], MessageCommitted)
    assert c.log[-1].conversation_seq == seq + 3  # the amends' seqs are never reused
