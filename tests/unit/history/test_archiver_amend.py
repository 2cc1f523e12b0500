"""HistoryArchiver of RECALL / EDIT (spec 13.4.1 steps 2-3): two rows per amend, convergent."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from qim.core.history import (
    AMEND_CUSTOM_TYPE,
    AmendControl,
    MemoryOrderedStore,
    MessageState,
    archive_batch,
    decode_message_record,
    message_key,
    to_history_message,
    write_all,
)
from qim.schemas.records.membership import MESSAGE_TYPE_CONTROL
from qim.schemas.records.outbox import AmendAction, MessageAmended, OutboxRecord
from tests.unit.history.support import C, T, committed


def amended(seq: int, target_seq: int, action: AmendAction, payload: bytes = b"") -> MessageAmended:
    """The amend at ``seq`` of the message ``committed(target_seq)``."""
    target = committed(target_seq)
    mid = ((1_000 + seq) << 80 | seq).to_bytes(16, "big")
    return MessageAmended(
        tenant_id=T,
        conversation_id=C,
        conversation_kind="group",
        message_id=mid,
        conversation_seq=seq,
        last_activity_id=mid,
        sender_id="u1",
        origin_device_id="d1",
        action=action,
        target_message_id=target.message_id,
        target_conversation_seq=target_seq,
        target_sender_id=target.sender_id,
        new_payload=payload,
        member_count=3,
        committed_at=1_700_000_000_000 + seq,
    )


def archive(store: MemoryOrderedStore, batch: Sequence[OutboxRecord]) -> None:
    write_all(store, archive_batch(batch, read=store.get))


def test_13_4_1_amend_writes_its_control_row_and_marks_the_target_in_one_batch() -> None:
    store = MemoryOrderedStore()
    archive(store, [committed(1, payload=b"secret"), amended(2, 1, "recall")])
    target = decode_message_record(store.get(message_key(T, C, 1)) or b"")
    assert (target.state, target.recall_event_conversation_seq) == (MessageState.RECALLED, 2)
    assert to_history_message(target).payload_or_ciphertext is None  # body withheld
    control = decode_message_record(store.get(message_key(T, C, 2)) or b"")
    assert (control.message_type, control.custom_type) == (MESSAGE_TYPE_CONTROL, AMEND_CUSTOM_TYPE)
    assert control.sender_id == "u1" and control.conversation_seq == 2
    body = msgspec.msgpack.decode(control.payload_or_ciphertext, type=AmendControl)
    assert body == AmendControl(
        action="recall", target_conversation_seq=1, target_message_id=target.message_id
    )


def test_13_4_1_edit_across_batches_reads_the_store() -> None:
    store = MemoryOrderedStore()
    archive(store, [committed(1, payload=b"v1")])
    edit = amended(2, 1, "edit", b"v2")
    archive(store, [edit])
    target = decode_message_record(store.get(message_key(T, C, 1)) or b"")
    assert target.state == MessageState.EDITED
    assert target.edited_at_activity_id == edit.last_activity_id
    assert to_history_message(target).payload_or_ciphertext == b"v2"
    assert archive_batch([amended(3, 1, "recall")]) != archive_batch(
        [amended(3, 1, "recall")], read=store.get
    )  # without the store the target row is not rewritten


def test_delete_marks_deleted_and_a_missing_or_foreign_target_is_left_alone() -> None:
    store = MemoryOrderedStore()
    archive(store, [committed(1), amended(2, 1, "delete"), amended(3, 9, "recall")])
    assert decode_message_record(store.get(message_key(T, C, 1)) or b"").state == "DELETED"
    assert store.get(message_key(T, C, 9)) is None  # no orphan row for an absent target
    assert store.get(message_key(T, C, 3)) is not None  # the event itself is still history
    foreign = msgspec.structs.replace(amended(4, 1, "recall"), target_message_id=b"\x01" * 16)
    archive(store, [foreign])
    assert decode_message_record(store.get(message_key(T, C, 1)) or b"").state == "DELETED"


def _items(store: MemoryOrderedStore) -> list[tuple[bytes, bytes]]:
    return list(store.scan(b"", b"", reverse=False))


def test_replay_and_redelivery_converge_byte_for_byte() -> None:
    log: list[OutboxRecord] = [
        committed(1, payload=b"a"),
        committed(2, payload=b"b"),
        amended(3, 2, "edit", b"b2"),
        amended(4, 1, "recall"),
        amended(5, 2, "edit", b"b3"),
        amended(6, 2, "recall"),
        amended(7, 2, "edit", b"late"),  # lost the race with the recall: changes nothing
    ]
    whole = MemoryOrderedStore()
    archive(whole, log)
    one_by_one = MemoryOrderedStore()
    for record in log:
        archive(one_by_one, [record])
    assert _items(one_by_one) == _items(whole)
    for cut in range(len(log)):
        redelivered = MemoryOrderedStore()
        archive(redelivered, log)
        archive(redelivered, log[cut:])  # a replayed suffix (crash before the offset commit)
        assert _items(redelivered) == _items(whole), cut
    final = decode_message_record(whole.get(message_key(T, C, 2)) or b"")
    assert (final.state, final.recall_event_conversation_seq) == (MessageState.RECALLED, 6)
