"""The ConnectionNode's expansion of a PushBatch (11.1.1, I-20, I-21, 15.1.1, 26.5.2)."""

from __future__ import annotations

import dataclasses

import msgspec

from qim.core.push import ConnectionPush, WritePush, expand_batch, plan_push
from qim.schemas.frames import EventType, PushEvents, SyncEntry
from qim.schemas.records.push import (
    STALE_EPOCH_MISMATCH,
    STALE_UNKNOWN_CONNECTION,
    PushBatch,
    PushBody,
    decode_to_gateway,
    encode_push_record,
)

from .support import NOW, SHARD, Conn, T, cache_with, entry, presence

BODY = PushBody(message_type=1, custom_type="card", payload_or_ciphertext=b"\x00body\xff")


def _batch(*users_devices: tuple[str, str], epoch: int = 1) -> PushBatch:
    """One batch (all users on one ConnectionShard: same user, several devices)."""
    devices = [presence(u, d, epoch=epoch) for u, d in users_devices]
    plan = plan_push(
        [entry(u, client_message_id="cm") for u in {u for u, _ in users_devices}],
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache_with(*devices),
        now_ms=NOW,
        body=BODY,
    )
    (batch,) = plan.batches
    decoded = decode_to_gateway(encode_push_record(batch))  # as the gateway receives it
    assert isinstance(decoded, PushBatch)
    return decoded


def _conns(batch: PushBatch, epoch: int | None = None) -> dict[str, Conn]:
    return {
        r.connection_id: Conn(
            T, r.user_id, r.device_id, r.session_epoch if epoch is None else epoch
        )
        for r in batch.recipients
    }


def test_11_1_1_push_events_is_the_materialized_entry_plus_the_shared_body() -> None:
    batch = _batch(("alice", "phone"))
    (delivery,) = expand_batch(batch, _conns(batch)).deliveries
    push = ConnectionPush(sync_to_seq=0)
    push.sync_complete()
    (write,) = push.offer(delivery.pending)
    assert isinstance(write, WritePush)
    frame = msgspec.msgpack.decode(write.body, type=PushEvents)
    expected = msgspec.structs.replace(
        entry("alice", client_message_id="cm").entry,
        body_included=True,
        message_type=1,
        custom_type="card",
        payload_or_ciphertext=b"\x00body\xff",
    )
    assert frame == PushEvents(events=(expected,), last_pushed_user_seq=expected.mailbox_seq)


def test_11_1_1_without_body_the_reference_part_still_arrives() -> None:
    batch = msgspec.structs.replace(_batch(("bob", "phone")), body_included=False)
    (delivery,) = expand_batch(batch, _conns(batch)).deliveries
    (event,) = msgspec.msgpack.decode(delivery.pending.body(1), type=PushEvents).events
    assert event.body_included is False and event.payload_or_ciphertext is None
    assert event == msgspec.structs.replace(entry("bob").entry)


def test_10_3_the_common_fragment_is_built_once_per_batch_and_shared() -> None:
    batch = _batch(("bob", "phone"), ("bob", "desk"), ("bob", "tablet"))
    deliveries = expand_batch(batch, _conns(batch)).deliveries
    assert len(deliveries) == 3
    assert len({id(d.pending.common) for d in deliveries}) == 1


def test_11_1_1_stale_epoch_drops_that_recipient_and_answers_presence_stale() -> None:
    batch = _batch(("bob", "phone"), ("bob", "desk"), epoch=4)
    conns = _conns(batch)
    phone = next(r for r in batch.recipients if r.device_id == "phone")
    conns[phone.connection_id] = Conn(T, "bob", "phone", 5)  # replaced by a newer session
    expansion = expand_batch(batch, conns)
    assert [d.connection_id for d in expansion.deliveries] == [
        r.connection_id for r in batch.recipients if r.device_id == "desk"
    ]
    (stale,) = expansion.stale
    assert (stale.user_id, stale.device_id, stale.connection_id) == (
        "bob",
        "phone",
        phone.connection_id,
    )
    assert stale.observed_epoch == 4 and stale.reason == STALE_EPOCH_MISMATCH
    assert stale.partition == SHARD


def test_11_1_1_unknown_connection_or_other_device_is_stale() -> None:
    batch = _batch(("bob", "phone"), ("bob", "desk"))
    conns = _conns(batch)
    phone, desk = sorted(batch.recipients, key=lambda r: r.device_id != "phone")
    del conns[phone.connection_id]
    conns[desk.connection_id] = Conn(T, "bob", "laptop", desk.session_epoch)
    expansion = expand_batch(batch, conns)
    assert expansion.deliveries == ()
    assert {s.reason for s in expansion.stale} == {STALE_UNKNOWN_CONNECTION}
    assert len(expansion.stale) == 2


def test_11_1_1_an_event_group_gives_one_frame_and_one_stale_per_device() -> None:
    cache = cache_with(presence("bob"))
    plan = plan_push(
        [entry("bob"), entry("bob", event_type=EventType.MENTION)],
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache,
        now_ms=NOW,
        body=BODY,
    )
    (batch,) = plan.batches
    (delivery,) = expand_batch(batch, _conns(batch)).deliveries
    events = msgspec.msgpack.decode(delivery.pending.body(0), type=PushEvents).events
    assert [e.event_type for e in events] == [EventType.MESSAGE, EventType.MENTION]
    assert len(expand_batch(batch, _conns(batch, epoch=9)).stale) == 1


def test_15_1_1_last_pushed_user_seq_is_the_max_written_and_feeds_pong() -> None:
    push = ConnectionPush(sync_to_seq=100)
    push.sync_complete()
    assert push.pong() == (100, False)  # starts at AUTH_OK.sync_to_seq
    batch = _batch(("bob", "phone"))
    (delivery,) = expand_batch(batch, _conns(batch)).deliveries
    seq = delivery.pending.mailbox_seq
    (write,) = push.offer(delivery.pending)
    assert isinstance(write, WritePush) and write.last_pushed_user_seq == seq
    older = dataclasses.replace(delivery.pending, mailbox_seq=seq - 1)  # late, out of order
    (write,) = push.offer(older)
    assert isinstance(write, WritePush) and write.last_pushed_user_seq == seq  # I-21: no decrease
    assert push.pong() == (seq, False)


def test_a41_pushed_and_pulled_entries_share_one_shape() -> None:
    batch = _batch(("bob", "phone"))
    (delivery,) = expand_batch(batch, _conns(batch)).deliveries
    (event,) = msgspec.msgpack.decode(delivery.pending.body(0), type=PushEvents).events
    assert isinstance(event, SyncEntry)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=SyncEntry) == event
