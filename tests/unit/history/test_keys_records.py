"""MessageStore keys sort by (tenant, conversation, seq); MessageRecord round-trips (6.1, 7.1)."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from qim.core.history import (
    MemoryOrderedStore,
    MessageRecord,
    MessageState,
    conversation_prefix,
    decode_message_record,
    encode_message_record,
    mark_deleted,
    mark_edited,
    mark_recalled,
    message_key,
    seq_from_key,
    to_history_message,
)

_ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=6)
_seq = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.lists(st.tuples(_ids, _ids, _seq), min_size=2, max_size=30))
def test_6_1_key_byte_order_is_tenant_conversation_then_numeric_seq(
    coords: list[tuple[str, str, int]],
) -> None:
    by_key = sorted(coords, key=lambda c: message_key(*c))
    by_seq_within = sorted(coords, key=lambda c: (message_key(*c)[:-8], c[2]))
    assert by_key == by_seq_within
    for tenant, conversation, seq in coords:
        key = message_key(tenant, conversation, seq)
        assert key.startswith(conversation_prefix(tenant, conversation))
        assert seq_from_key(key) == seq


def test_7_1_one_conversation_prefix_never_covers_another() -> None:
    assert not message_key("t1", "g:10", 1).startswith(conversation_prefix("t1", "g:1"))
    assert not message_key("t10", "g:1", 1).startswith(conversation_prefix("t1", "g:1"))
    assert message_key("t1", "g:1", 2**64 - 1) < message_key("t1", "g:10", 0)


@given(
    st.dictionaries(st.integers(0, 50), st.binary(max_size=3), max_size=20),
    st.integers(0, 60),
    st.booleans(),
)
def test_memory_store_scan_follows_the_rocksdb_seek_contract(
    rows: dict[int, bytes], start: int, reverse: bool
) -> None:
    store = MemoryOrderedStore()
    for seq, value in rows.items():
        store.put(message_key("t", "a", seq), value)
        store.put(message_key("t", "b", seq), b"other")  # a neighbour conversation
    prefix = conversation_prefix("t", "a")
    got = [
        (seq_from_key(k), v) for k, v in store.scan(prefix, message_key("t", "a", start), reverse)
    ]
    kept = [(s, v) for s, v in rows.items() if (s <= start if reverse else s >= start)]
    assert got == sorted(kept, reverse=reverse)


def _record(**kw: object) -> MessageRecord:
    base = MessageRecord(
        tenant_id="t1",
        conversation_id="g:c",
        conversation_seq=7,
        message_id=bytes(range(16)),
        sender_id="u1",
        payload_or_ciphertext=b"secret",
    )
    return msgspec.structs.replace(base, **kw)


def test_7_1_message_record_round_trips_byte_exact() -> None:
    record = _record(mention_targets=("u2",), reply_to_conversation_seq=3)
    data = encode_message_record(record)
    assert decode_message_record(data) == record
    assert encode_message_record(decode_message_record(data)) == data
    assert "state" not in msgspec.msgpack.decode(data)  # defaults omitted: NORMAL


def test_13_4_recall_delete_and_edit_state_changes() -> None:
    record = _record()
    recalled = mark_recalled(record, 9)
    assert (recalled.state, recalled.recall_event_conversation_seq) == (MessageState.RECALLED, 9)
    wire = to_history_message(recalled)
    assert wire.payload_or_ciphertext is None and wire.state == "RECALLED"
    assert to_history_message(mark_deleted(record, 9)).payload_or_ciphertext is None
    edited = mark_edited(record, 10, b"new", bytes(16))
    assert to_history_message(edited).payload_or_ciphertext == b"new"
    assert edited.state == MessageState.EDITED and edited.recall_event_conversation_seq == 10
    assert mark_edited(recalled, 11, b"late edit", bytes(16)) == recalled
    assert to_history_message(record).payload_or_ciphertext == b"secret"
