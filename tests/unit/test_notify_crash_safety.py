"""The NotificationService's crash safety (spec 16.2.4, AT-108; issue 17): the dedup state
that admitted a push is durable before the push leaves, so a replay onto the recovered table
never notifies twice; a write that failed sends nothing; the deliveries at once are bounded
(the bound on what a kill -9 can lose); open merge windows are re-learnt from the table."""

from __future__ import annotations

import asyncio

from qim.agents.notify.service import NotifyService
from qim.core.notify.rules import PushPolicy
from qim.schemas.records.notify import DeviceKey, PushTask, encode
from tests.unit.test_notify_tokens import T0, FakeProvider, Rig


def _task(event_id: str, conversation_id: str = "") -> bytes:
    return encode(
        PushTask(
            tenant_id="t",
            user_id="u",
            device_id="phone",
            event_id=event_id,
            mailbox_seq=1,
            conversation_id=conversation_id or f"c-{event_id}",
        )
    )


def _restarted(rig: Rig, provider: FakeProvider) -> NotifyService:
    """A new worker over the same tables (what the changelog recovery gives back)."""
    old = rig.service
    return NotifyService(
        tokens=old.tokens,
        states=old.states,
        providers={"APNS": provider},
        sealer=old.sealer,
        send=old.send,
        policy=PushPolicy(),
        now_ms=lambda: rig.now,
        commands_topic="commands",
        digest_topic="digest",
        push_topic="tasks",
    )


async def test_the_push_waits_until_its_dedup_state_is_durable() -> None:
    provider = FakeProvider()
    rig = Rig(provider)
    await rig.register("phone", "ab" * 32, T0)
    gate = asyncio.Event()
    waited: list[bytes] = []

    async def durable(key: bytes) -> None:
        waited.append(key)
        await gate.wait()

    rig.service.durable = durable
    await rig.service.on_push_task(rig.key("phone"), _task("e1"), 3)
    for _ in range(5):
        await asyncio.sleep(0)
    assert waited == [rig.key("phone")] and provider.sent == []
    assert rig.key("phone") in rig.service.states  # the dedup set is written first
    gate.set()
    await asyncio.gather(*rig.service.inflight)
    assert provider.sent == ["ab" * 32]


async def test_a_replay_after_a_crash_finds_the_dedup_set_and_sends_nothing() -> None:
    provider = FakeProvider()
    rig = Rig(provider)
    await rig.register("phone", "ab" * 32, T0)
    await rig.push("phone", "e1")
    assert len(provider.sent) == 1
    again = FakeProvider()
    restarted = _restarted(rig, again)
    await restarted.on_push_task(rig.key("phone"), _task("e1"), 3)  # the replay
    await restarted.on_push_task(rig.key("phone"), _task("e2"), 3)  # a later one: sent
    await asyncio.gather(*restarted.inflight)
    assert len(again.sent) == 1
    assert restarted.tasks.labels("held_or_duplicate")._value.get() == 1


async def test_a_dedup_write_that_failed_sends_nothing() -> None:
    provider = FakeProvider()
    rig = Rig(provider)
    await rig.register("phone", "ab" * 32, T0)

    async def broken(key: bytes) -> None:
        raise RuntimeError("changelog produce failed")

    rig.service.durable = broken
    await rig.push("phone", "e1")
    assert provider.sent == []
    assert rig.service.pushes.labels("APNS", "alert", "not_durable")._value.get() == 1
    assert rig.service.slots._value == rig.service.max_inflight  # the slot came back


async def test_deliveries_at_once_are_bounded_by_max_inflight() -> None:
    release = asyncio.Event()

    class Slow(FakeProvider):
        async def send(self, token: str, bundle_env: str, note: object) -> object:  # type: ignore[override]
            await release.wait()
            return await super().send(token, bundle_env, note)  # type: ignore[arg-type]

    provider = Slow()
    rig = Rig(provider)
    rig.service = _restarted(rig, provider)
    rig.service.max_inflight = 2
    rig.service.slots = asyncio.Semaphore(2)
    for device in ("a", "b", "c"):
        await rig.register(device, f"{device}0" * 32, T0)

    async def push(device: str) -> None:
        task = encode(
            PushTask(tenant_id="t", user_id="u", device_id=device, event_id="e", mailbox_seq=1)
        )
        await rig.service.on_push_task(DeviceKey("t", "u", device).encode(), task, 3)

    await push("a")
    await push("b")
    third = asyncio.create_task(push("c"))
    for _ in range(10):
        await asyncio.sleep(0)
    # the agent waits for a slot: two deliveries run, the third task is not admitted yet
    assert not third.done() and len(rig.service.inflight) == 2 and provider.sent == []
    release.set()
    await third
    await asyncio.gather(*rig.service.inflight)
    assert len(provider.sent) == 3


async def test_open_merge_windows_are_relearnt_from_the_table_after_a_restart() -> None:
    provider = FakeProvider()
    rig = Rig(provider)
    await rig.register("phone", "ab" * 32, T0)
    for event in ("e1", "e2"):  # the first goes out, the second is held in the window
        await rig.service.on_push_task(rig.key("phone"), _task(event, "g"), 3)
    await asyncio.gather(*rig.service.inflight)
    restarted = _restarted(rig, FakeProvider())
    assert restarted.due == {}
    assert restarted.recover_due(lambda key: 3) == 1
    [(key, partition, due)] = restarted.due_flushes(T0 + 10**9)
    assert (key, partition) == (rig.key("phone"), 3) and due > T0
    assert restarted.recover_due(lambda key: 3) == 0  # already known


async def test_deliveries_wait_until_the_providers_are_open() -> None:
    """A restarted worker replays PushTasks before its app task opened the providers: they
    wait for them instead of failing as provider_not_configured."""
    provider = FakeProvider()
    rig = Rig(provider)
    await rig.register("phone", "ab" * 32, T0)
    late = _restarted(rig, provider)
    late.providers = {}
    late.providers_ready.clear()
    await late.on_push_task(rig.key("phone"), _task("e1"), 3)
    for _ in range(5):
        await asyncio.sleep(0)
    assert provider.sent == [] and len(late.inflight) == 1
    late.set_providers({"APNS": provider})
    await asyncio.gather(*late.inflight)
    assert provider.sent == ["ab" * 32]
    assert late.pushes.labels("APNS", "alert", "delivered")._value.get() == 1
