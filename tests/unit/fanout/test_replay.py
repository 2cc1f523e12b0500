"""Identity and idempotency: spec 7.8's frozen dispatch_id, replay gives identical bytes (10.4)."""

from __future__ import annotations

import pytest

from qim.core.fanout import (
    CHUNK_DISPATCH_ID_DOMAIN,
    FanoutConfig,
    FanoutState,
    chunk_dispatch_id,
    chunk_dispatch_id_input,
)
from qim.schemas import dispatch_id_input
from qim.schemas.records.dispatch import (
    DispatchLogRecord,
    GroupDispatch,
    decode_dispatch_record,
    encode_dispatch_record,
)
from qim.schemas.records.outbox import OutboxRecord
from tests.unit.fanout.support import Outbox, run, shard_of

SPEC_MESSAGE_ID = int("00317c9c107b00100005000003000000", 16)
SPEC_DISPATCH_ID = "1ed4a42fc1cb38a08a02e7b8324ba354"


def _encoded(records: list[DispatchLogRecord]) -> list[tuple[int, bytes]]:
    return [(r.partition, encode_dispatch_record(r)) for r in records]


def _busy_outbox() -> Outbox:
    outbox = Outbox()
    outbox.create("g:a", "owner", [f"m{i}" for i in range(40)])
    outbox.create("g:b", "boss", ["m1", "m2", "m3"])
    outbox.send("g:a", "owner", mentions=("m3", "@all"))
    outbox.add("g:a", ["n1", "n2"])
    outbox.send("g:b", "m1", inline=True, payload=b"x" * 100)
    outbox.leave("g:a", "m7")
    outbox.remove("g:a", ["m8", "n1"], ban=True)
    outbox.send("g:a", "n2")
    outbox.direct("m1", "m2")
    outbox.add("g:a", ["m7"])  # rejoin
    outbox.send("g:a", "m7")
    return outbox


def test_7_8_worked_example_message_to_shard_242_has_the_frozen_dispatch_id() -> None:
    shards = 256
    peer = next(f"u{i}" for i in range(100_000) if shard_of(f"u{i}", shards) == 242)
    record = Outbox(shards=shards).direct(peer, peer, message_id=SPEC_MESSAGE_ID)
    state = FanoutState(FanoutConfig(mailbox_shard_count=shards))
    produced = state.apply_outbox(record)
    assert isinstance(produced, list)
    (dispatch,) = produced
    assert isinstance(dispatch, GroupDispatch)
    assert dispatch.target_mailbox_shard == dispatch.partition == 242
    assert dispatch.dispatch_id.hex() == SPEC_DISPATCH_ID
    assert (dispatch.chunk_index, dispatch.chunk_count) == (0, 1)


def test_7_8_chunk_zero_is_the_frozen_id_and_later_chunks_have_their_own_domain() -> None:
    assert chunk_dispatch_id(SPEC_MESSAGE_ID, 242, 0).hex() == SPEC_DISPATCH_ID
    later = chunk_dispatch_id_input(SPEC_MESSAGE_ID, 242, 1)
    assert later.startswith(CHUNK_DISPATCH_ID_DOMAIN.encode() + b"\x00")
    assert len(later) == 28 + 16 + 4 + 4 and len(dispatch_id_input(SPEC_MESSAGE_ID, 242)) == 42
    ids = {chunk_dispatch_id(SPEC_MESSAGE_ID, shard, c) for shard in (0, 242) for c in range(4)}
    assert len(ids) == 8
    with pytest.raises(ValueError):
        chunk_dispatch_id_input(SPEC_MESSAGE_ID, 242, 0)


def test_10_4_replaying_the_same_outbox_twice_gives_byte_identical_dispatch_logs() -> None:
    log: list[OutboxRecord] = _busy_outbox().log
    first = _encoded(run(FanoutState(), log))
    second = _encoded(run(FanoutState(), log))
    assert first == second
    assert sum(1 for _, data in first if b"dispatch" in data) > 10
    for partition, data in first:
        record = decode_dispatch_record(data)
        assert record.partition == partition
        assert encode_dispatch_record(record) == data


def test_adr_0012_every_record_applied_twice_yields_the_same_dispatches() -> None:
    state = FanoutState()
    for record in _busy_outbox().log:
        once = state.apply_outbox(record)
        twice = state.apply_outbox(record)  # at-least-once redelivery
        assert isinstance(once, list) and isinstance(twice, list)
        assert _encoded(once) == _encoded(twice)


def test_adr_0012_a_rewind_after_later_changes_redelivers_identical_dispatches() -> None:
    log = _busy_outbox().log
    state = FanoutState()
    first = run(state, log)
    redelivered = run(state, log)  # the whole outbox again, on top of the final state
    assert _encoded(redelivered) == _encoded(first)


def test_4_2_state_snapshot_round_trips_and_continues_byte_identically() -> None:
    log = _busy_outbox().log
    cut = len(log) // 2
    live = FanoutState()
    run(live, log[:cut])
    restored = FanoutState.decode(live.encode())
    assert restored.encode() == live.encode()
    assert _encoded(run(restored, log[cut:])) == _encoded(run(live, log[cut:]))
    assert restored.encode() == live.encode()
