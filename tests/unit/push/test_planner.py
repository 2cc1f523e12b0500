"""The MailboxNode's push planner: one PushBatch per ConnectionShard per message (11.1, I-19)."""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.membership import ShardSlice, bitmap_bytes
from qim.core.push import MaterializedEntry, plan_push, push_body_of, push_priority
from qim.schemas.frames import EventType
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.push import PushBody, encode_push_body, encode_push_record

from .support import MESSAGE_ID, NOW, SHARD, T, cache_with, conn_shard, entry, presence, shard_users

BODY = PushBody(message_type=1, payload_or_ciphertext=b"hello group")


class CountingEncoder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, body: PushBody) -> bytes:
        self.calls += 1
        return encode_push_body(body)


def test_11_1_one_batch_per_connection_shard_for_1000_members_200_online() -> None:
    members = shard_users(1000)
    online = members[::5]  # 200 users, each with one or two devices
    devices = [presence(u, "phone") for u in online] + [presence(u, "desk") for u in online[::4]]
    cache = cache_with(*devices)
    encoder = CountingEncoder()
    plan = plan_push(
        [entry(u, sender=members[0]) for u in members],
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache,
        now_ms=NOW,
        body=BODY,
        priority="small_group",
        encode=encoder,
    )
    # 10.1 step 10 / 5.4.3: the member slice AND the online bitmap gives the 200 online users.
    key = cache.online.register(
        ShardSlice(
            tenant_id=T,
            group_id="g:big",
            membership_version=1,
            mailbox_shard=SHARD,
            member_count=1000,
            slot_bitmap=bitmap_bytes(range(1000)),
            slots=tuple(range(1000)),
            user_ids=members,
            joined_at=(0,) * 1000,
        )
    )
    assert cache.online.online_members(key) == online
    shards = {conn_shard(u) for u in online}
    assert len(shards) > 1  # the users really spread over several ConnectionShards (5.2)
    assert [b.connection_shard for b in plan.batches] == sorted(shards)
    assert encoder.calls == 1  # encoded once per message (10.3)
    bodies = {id(b.common_encoded_body) for b in plan.batches}
    assert len(bodies) == 1  # the very same bytes object in every batch
    assert plan.recipient_count == len(devices) == 250
    per_shard = Counter(d.connection_shard for d in devices)
    assert {b.connection_shard: len(b.recipients) for b in plan.batches} == per_shard
    assert len(plan.offline_users) == 800
    for batch in plan.batches:
        assert batch.mailbox_shard == SHARD and batch.priority == "small_group"
        assert all(conn_shard(r.user_id) == batch.connection_shard for r in batch.recipients)


def test_11_1_a_recipient_with_no_live_device_is_left_for_the_mailbox() -> None:
    cache = cache_with(presence("bob", lease=NOW + 10))
    plan = plan_push(
        [entry("bob")], tenant_id=T, mailbox_shard=SHARD, presence=cache, now_ms=NOW + 10, body=BODY
    )
    assert plan.batches == () and plan.offline_users == ("bob",)


def test_11_1_no_online_recipient_means_no_encode_and_no_batch() -> None:
    encoder = CountingEncoder()
    plan = plan_push(
        [entry("bob")],
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache_with(),
        now_ms=NOW,
        body=BODY,
        encode=encoder,
    )
    assert plan.batches == () and encoder.calls == 0


def test_9_7_senders_other_devices_get_the_message_and_its_client_message_id() -> None:
    cache = cache_with(presence("alice", "phone"), presence("alice", "desk"), presence("bob"))
    plan = plan_push(
        [entry("alice", client_message_id="cm-1"), entry("bob", client_message_id="cm-1")],
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache,
        now_ms=NOW,
        body=BODY,
    )
    rows = [r for b in plan.batches for r in b.recipients]
    mine = {r.device_id: r for r in rows if r.user_id == "alice"}
    assert set(mine) == {"phone", "desk"}  # the MESSAGE echoes to the origin device too (7.3)
    assert all(r.client_message_id == "cm-1" for r in mine.values())
    assert [r.client_message_id for r in rows if r.user_id == "bob"] == [None]


def test_9_7_2_a_control_event_is_not_pushed_back_to_its_origin_device() -> None:
    cache = cache_with(presence("alice", "phone"), presence("alice", "desk"))
    read_event = entry("alice", event_type=EventType.CONTROL, origin_device_id="phone")
    plan = plan_push(
        [read_event], tenant_id=T, mailbox_shard=SHARD, presence=cache, now_ms=NOW, body=None
    )
    rows = [r for b in plan.batches for r in b.recipients]
    assert [r.device_id for r in rows] == ["desk"]
    assert plan.skipped_origin == 1
    assert all(not b.body_included and b.common_encoded_body == b"" for b in plan.batches)


def test_6_7_an_event_group_travels_as_several_headers_of_one_batch() -> None:
    cache = cache_with(presence("bob"))
    group = [entry("bob", event_type=EventType.MENTION), entry("bob")]
    plan = plan_push(group, tenant_id=T, mailbox_shard=SHARD, presence=cache, now_ms=NOW, body=BODY)
    (batch,) = plan.batches
    assert [r.event_ordinal for r in batch.recipients] == [EventType.MESSAGE, EventType.MENTION]


def test_11_1_entries_of_two_messages_are_refused() -> None:
    carol = entry("carol").entry
    other = MaterializedEntry("carol", msgspec.structs.replace(carol, conversation_seq=8))
    with pytest.raises(ValueError, match="exactly one message"):
        plan_push(
            [entry("bob"), other],
            tenant_id=T,
            mailbox_shard=SHARD,
            presence=cache_with(),
            now_ms=NOW,
            body=BODY,
        )


def test_11_3_2_priority_follows_conversation_kind_and_size() -> None:
    assert push_priority("direct", 2) == "direct"
    assert push_priority("group", 1000) == "small_group"
    assert push_priority("group", 1001) == "large_group"


def test_direction_4_4_the_body_comes_from_the_dispatch() -> None:
    dispatch = GroupDispatch(
        tenant_id=T,
        dispatch_id=bytes(16),
        message_id=MESSAGE_ID,
        conversation_id="g:big",
        conversation_kind="group",
        conversation_seq=7,
        last_activity_id=MESSAGE_ID,
        sender_id="alice",
        target_mailbox_shard=SHARD,
        committed_at=NOW,
        message_type=1,
        payload=b"p",
    )
    assert push_body_of(dispatch) == PushBody(message_type=1, payload_or_ciphertext=b"p")


USERS = shard_users(40)


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False))
def test_direction_4_7_shuffled_input_gives_identical_batches(rnd: random.Random) -> None:
    devices = [presence(u, d) for u in USERS[::2] for d in ("phone", "desk")]
    entries = [entry(u, sender=USERS[0]) for u in USERS]
    expected = plan_push(
        entries,
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache_with(*devices),
        now_ms=NOW,
        body=BODY,
    )
    rnd.shuffle(devices)
    rnd.shuffle(entries)
    got = plan_push(
        entries,
        tenant_id=T,
        mailbox_shard=SHARD,
        presence=cache_with(*devices),
        now_ms=NOW,
        body=BODY,
    )
    assert [encode_push_record(b) for b in got.batches] == [
        encode_push_record(b) for b in expected.batches
    ]
