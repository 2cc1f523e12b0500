"""The callee's ConnectionNode hands an invite for a callee with no connection to offline push
(spec 13.5.2): one ``voip`` PushTask on ``qim.push-tasks`` at the callee's mailbox shard, and
the ring timer runs as if it rang; an online callee is rung, not pushed; a node without a
push topic answers the caller ``cancel{offline}`` as before."""

from __future__ import annotations

from qim.params import Settings
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.records.notify import VOIP_DEVICE, DeviceKey, decode_push_task
from qim.schemas.records.transient import RtcRelay, decode_rtc_relay
from qim.streams.topics import PUSH_TASKS, TO_GATEWAY
from tests.gateway_support import wait_until
from tests.unit.gateway.test_router import Harness, harness

SETTINGS = Settings.load(env={})


def _invite(h: Harness, callee: str, call_id: str) -> RtcRelay:
    return RtcRelay(
        tenant_id="t1",
        target_user_id=callee,
        connection_shard=h.node.logins.shard_of("t1", callee),
        signal=RtcSignalDown(
            conversation_id="d:alice:bob",
            from_user_id="alice",
            from_device_id="pc",
            call_id=call_id,
            signal_type="invite",
            signal_payload=b"offer",
        ),
    )


def _sent(h: Harness, topic: str) -> list[tuple[bytes, bytes, int]]:
    return [(k, v, p) for t, k, v, p in h.producer.sent if t == topic]


async def test_an_invite_for_a_callee_with_no_connection_becomes_one_voip_push_task() -> None:
    async with harness() as h:
        rtc = h.node.rtc
        assert rtc is not None
        assert rtc.incoming(_invite(h, "bob", "c1")) == 0
        await wait_until(lambda: bool(_sent(h, PUSH_TASKS.name)))
        [(key, value, partition)] = _sent(h, PUSH_TASKS.name)
        task = decode_push_task(value)
        assert (task.kind, task.user_id, task.device_id) == ("voip", "bob", VOIP_DEVICE)
        assert (task.call_id, task.caller_user_id, task.caller_device_id) == ("c1", "alice", "pc")
        assert task.caller_connection_shard == h.node.logins.shard_of("t1", "alice")
        assert task.callee_connection_shard == h.node.logins.shard_of("t1", "bob")
        assert key == task.key.encode()
        assert partition == DeviceKey("t1", "bob", VOIP_DEVICE).partition(
            virtual_bucket_count=int(SETTINGS.virtual_bucket_count),
            mailbox_shard_count=int(SETTINGS.mailbox_shard_count),
        )
        assert len(rtc.timers) == 1  # it rings (for the caller) until rtc_ring_timeout
        assert _sent(h, TO_GATEWAY.name) == []  # no offline answer


async def test_an_online_callee_is_rung_and_not_pushed() -> None:
    async with harness() as h:
        rtc = h.node.rtc
        assert rtc is not None
        await h.online("bob", "phone")
        assert rtc.incoming(_invite(h, "bob", "c1")) == 1
        assert rtc.incoming(_invite(h, "carol", "c2")) == 0  # the barrier: carol is pushed
        await wait_until(lambda: bool(_sent(h, PUSH_TASKS.name)))
        tasks = [decode_push_task(v) for _, v, _ in _sent(h, PUSH_TASKS.name)]
        assert [(t.user_id, t.call_id) for t in tasks] == [("carol", "c2")]


async def test_without_a_push_topic_the_caller_is_answered_offline() -> None:
    async with harness(push_tasks_topic="") as h:
        rtc = h.node.rtc
        assert rtc is not None
        assert rtc.incoming(_invite(h, "bob", "c1")) == 0
        await wait_until(lambda: bool(_sent(h, TO_GATEWAY.name)))
        [(_, value, _)] = _sent(h, TO_GATEWAY.name)
        relay = decode_rtc_relay(value)
        assert relay.target_user_id == "alice"
        assert (relay.signal.signal_type, relay.signal.reason) == ("cancel", "offline")
        assert _sent(h, PUSH_TASKS.name) == [] and len(rtc.timers) == 0
