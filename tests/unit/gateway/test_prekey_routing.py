"""Prekey frames through a real ConnectionNode's router (qim.gateway.routing.prekeys).

Invariants: PREKEY_PUBLISH / PREKEY_FETCH leave at the bundle owner's partition of
``qim.prekey-requests`` with the session's identity (never the frame's); a reply reaches only the
session it names, a server-initiated notice (``session_epoch=0``) the device's current one; a
malformed target id is PERMISSION_DENIED at once; without ``prekeys`` the frames stay "not
offered" (never silence).
"""

from __future__ import annotations

from qim.client.e2ee import DeviceKeys
from qim.gateway.routing.replies import ReplyVerdict
from qim.gateway.token_expiry import is_write
from qim.schemas.frames import (
    Error,
    ErrorCode,
    PrekeyBundle,
    PrekeyFetch,
    PrekeyFetchDown,
    encode_frame,
)
from qim.schemas.records.prekeys import (
    PrekeyFetchRequest,
    PrekeyPublishRequest,
    PrekeyReply,
    decode_prekey_request,
    encode_prekey_record,
    prekey_partition,
)
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import COUNT, harness

PARTITIONS = COUNT  # the fake producer reports this many for every topic


async def test_publish_and_fetch_go_to_the_owners_partition_with_the_sessions_identity() -> None:
    async with harness(prekeys=True, prekey_partition_count=PARTITIONS) as h:
        conn, _ = await h.online("alice", "phone")
        conn.feed_message(encode_frame(DeviceKeys().publish_frame(), 5))
        conn.feed_message(encode_frame(PrekeyFetch(target_user_id="bob"), 6))
        await wait_until(lambda: len(h.producer.sent) == 2)
        (t1, _, v1, p1), (t2, k2, v2, p2) = h.producer.sent
        publish, fetch = decode_prekey_request(v1), decode_prekey_request(v2)
        assert t1 == t2 == "qim.prekey-requests"
        assert isinstance(publish, PrekeyPublishRequest) and isinstance(fetch, PrekeyFetchRequest)
        assert p1 == prekey_partition("t1", "alice", PARTITIONS)
        assert p2 == prekey_partition("t1", "bob", PARTITIONS) and k2 == fetch.owner_key
        assert (fetch.user_id, fetch.device_id, fetch.request_id) == ("alice", "phone", 6)
        assert fetch.connection_shard == h.node.logins.shard_of("t1", "alice")


async def test_a_reply_reaches_its_session_and_a_notice_the_devices_current_one() -> None:
    async with harness(prekeys=True, prekey_partition_count=PARTITIONS) as h:
        conn, pipe = await h.online("alice", "phone")
        epoch = conn.session.grant.session_epoch  # type: ignore[union-attr]
        shard = h.node.logins.shard_of("t1", "alice")
        answer = PrekeyFetchDown(bundles=(PrekeyBundle(device_id="laptop"),))
        reply = PrekeyReply(
            tenant_id="t1", user_id="alice", device_id="phone", session_epoch=epoch,
            connection_shard=shard, request_id=9, bundles=answer,
        )  # fmt: skip
        stale = PrekeyReply(
            tenant_id="t1", user_id="alice", device_id="phone", session_epoch=epoch + 1,
            connection_shard=shard, request_id=10, bundles=answer,
        )  # fmt: skip
        notice = PrekeyReply(
            tenant_id="t1", user_id="alice", device_id="phone", connection_shard=shard,
            bundles=answer,
        )  # fmt: skip
        assert h.router.deliver(encode_prekey_record(reply)) is ReplyVerdict.DELIVER
        assert h.router.deliver(encode_prekey_record(stale)) is ReplyVerdict.STALE_EPOCH
        assert h.router.deliver(encode_prekey_record(notice)) is ReplyVerdict.DELIVER
        await wait_until(lambda: len([b for b in pipe.bodies() if b == answer]) == 2)
        ids = [f.header.request_id for f in pipe.frames if f.body == answer]
        assert ids == [9, 0]


async def test_a_malformed_target_is_permission_denied_without_kafka() -> None:
    async with harness(prekeys=True, prekey_partition_count=PARTITIONS) as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(PrekeyFetch(target_user_id="bad\x00id"), 7))
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        error = next(b for b in pipe.bodies() if isinstance(b, Error))
        assert (error.code, error.request_id) == (int(ErrorCode.PERMISSION_DENIED), 7)
        assert h.producer.sent == []


async def test_without_prekeys_the_frames_are_answered_not_offered() -> None:
    async with harness() as h:
        conn, pipe = await h.online()
        conn.feed_message(encode_frame(PrekeyFetch(target_user_id="bob"), 8))
        await wait_until(lambda: any(isinstance(b, Error) for b in pipe.bodies()))
        error = next(b for b in pipe.bodies() if isinstance(b, Error))
        assert error.request_id == 8 and "not offered" in error.detail
        assert h.producer.sent == []


def test_a_fetch_is_a_write_for_the_token_grace_since_it_consumes_the_targets_keys() -> None:
    assert is_write(PrekeyFetch(target_user_id="bob"))
    assert is_write(DeviceKeys().publish_frame())
