"""HistoryArchiver: outbox records -> MessageStore writes, idempotent under replay (ADR-0018)."""

from __future__ import annotations

from qim.core.history import (
    MemoryOrderedStore,
    VisibleInterval,
    archive_batch,
    decode_message_record,
    message_key,
    message_record,
    pull_history,
    write_all,
)
from qim.core.history.paging import HistoryBounds
from qim.schemas.frames.history import PullHistory
from qim.schemas.records.membership import (
    MEMBERSHIP_CUSTOM_TYPE,
    MESSAGE_TYPE_CONTROL,
    MembershipCommitted,
    decode_control,
)
from qim.schemas.records.outbox import MessageCommitted
from qim.schemas.seqs import seq_bucket
from tests.unit.history.support import C, T, committed
from tests.unit.membership.support import Harness


def test_7_1_committed_message_becomes_its_message_record() -> None:
    msg = committed(10_000, payload=b"body")
    record = message_record(msg)
    assert record.seq_bucket == seq_bucket(10_000) == 2  # spec 7.1 example: 10000 -> bucket 2
    assert (record.message_id, record.last_activity_id) == (msg.message_id, msg.last_activity_id)
    assert record.created_at == msg.committed_at  # never the archiver's clock
    assert record.sender_device_id == "d1" and record.client_message_id is None
    assert record.custom_type is None and record.payload_or_ciphertext == b"body"
    ((key, value),) = [(w.key, w.value) for w in archive_batch([msg])]
    assert key == message_key(T, C, 10_000) and value is not None
    assert decode_message_record(value) == record


def test_adr_0018_replaying_a_batch_rewrites_identical_bytes() -> None:
    batch = [committed(s, payload=bytes([s])) for s in range(1, 20)]
    once, twice = MemoryOrderedStore(), MemoryOrderedStore()
    write_all(once, archive_batch(batch))
    write_all(twice, archive_batch(batch))
    write_all(twice, archive_batch(batch[5:]))  # crash before the offset commit: redelivery
    prefix = message_key(T, C, 0)[:-8]
    assert list(once.scan(prefix, prefix, False)) == list(twice.scan(prefix, prefix, False))


def _membership_log() -> tuple[Harness, list[MembershipCommitted]]:
    h = Harness()
    h.create(T, C, "alice", ["bob", "carol"])
    h.send(T, C, 9)
    h.leave(T, C, "bob")  # seq 10
    return h, h.log


def test_A3_22_membership_control_message_is_archived_create_is_not() -> None:
    _, log = _membership_log()
    create, leave = log
    assert archive_batch([create]) == []  # a create occupies no seq (A.3 #21)
    ((write),) = archive_batch([leave])
    assert write.value is not None
    record = decode_message_record(write.value)
    assert write.key == message_key(T, C, 10)
    assert record.message_type == MESSAGE_TYPE_CONTROL
    assert record.custom_type == MEMBERSHIP_CUSTOM_TYPE
    assert record.sender_id == "bob" and record.message_id == leave.message_id
    control = decode_control(record.payload_or_ciphertext)
    assert (control.action, control.targets, control.membership_version) == ("leave", ("bob",), 2)


def test_12_10_leaver_reads_history_before_J_only_end_to_end() -> None:
    h, log = _membership_log()
    store = MemoryOrderedStore()
    outbox: list[MessageCommitted | MembershipCommitted] = [log[0]]
    outbox += [*(committed(s) for s in range(1, 10)), log[1]]
    outbox += [committed(s) for s in range(11, 15)]  # in-flight after the leave
    write_all(store, archive_batch(outbox))
    head = HistoryBounds(latest_conversation_seq=14, earliest_available_conversation_seq=1)

    def seqs(user: str) -> list[int]:
        interval = h.state.visible_interval(T, C, user)
        assert interval is not None
        batch = pull_history(
            store,
            tenant_id=T,
            request=PullHistory(conversation_id=C, direction="older", limit=50),
            interval=VisibleInterval(*interval),
            bounds=head,
        )
        return [m.conversation_seq for m in batch.messages]

    assert seqs("bob") == list(range(1, 10))  # < J only; not even the leave message itself
    assert seqs("carol") == list(range(1, 15))  # members see the CONTROL message at J = 10
    h.send(T, C, 4)  # seqs 11..14 were the in-flight messages above
    h.add(T, C, ["dave"])  # joins at seq 15: joined_at = 14
    write_all(store, archive_batch(h.log[-1:]))
    dave = pull_history(
        store,
        tenant_id=T,
        request=PullHistory(conversation_id=C, direction="newer"),
        interval=VisibleInterval(*(h.state.visible_interval(T, C, "dave") or (0, None))),
        bounds=HistoryBounds(latest_conversation_seq=15),
    )
    assert [m.conversation_seq for m in dave.messages] == [15]  # only from the join event on
    assert dave.messages[0].custom_type == MEMBERSHIP_CUSTOM_TYPE
