"""The NotificationService's ``voip`` path (spec 13.5.2) over in-memory tables and fake
providers: the fan-out through the ``user_devices`` index to the devices that registered the
``voip`` capability (APNs: the PushKit token, FCM: its token), the per-device daily quota and
per-call dedup, the ``cancel{offline}`` answer to both ConnectionShards when nothing could
ring, and an APNs "token dead" answer deleting only the PushKit token."""

from __future__ import annotations

import asyncio
from typing import Any

from qim.agents.notify.providers import Notification, ProviderResult
from qim.agents.notify.sealing import TokenSealer, voip_aad
from qim.agents.notify.service import NotifyService
from qim.core.notify.rules import PushPolicy
from qim.core.notify.voip import voip_task
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceToken,
    DeviceTokenCommand,
    DeviceTokenDelete,
    decode_command,
    decode_device_token,
    decode_digest,
    decode_user_devices,
    encode,
    user_devices_key,
)
from qim.schemas.records.transient import decode_rtc_relay

T0 = 1_800_000_000_000
PHONE_ALERT, PHONE_VOIP = "a1" * 32, "a2" * 32
TABLET_FCM = "fcm-" + "x" * 40
DESKTOP_ALERT = "d1" * 32


class FakeProvider:
    def __init__(self, name: str, *answers: ProviderResult) -> None:
        self.name = name
        self.answers = list(answers)
        self.sent: list[tuple[str, Notification]] = []

    async def send(self, token: str, bundle_env: str, note: Notification) -> ProviderResult:
        self.sent.append((token, note))
        return self.answers.pop(0) if self.answers else ProviderResult(200)

    async def aclose(self) -> None:
        return None


class Rig:
    def __init__(self, quota: int = 200, *apns_answers: ProviderResult) -> None:
        self.sealer = TokenSealer.parse(TokenSealer.generate_line())
        self.apns = FakeProvider("APNS", *apns_answers)
        self.fcm = FakeProvider("FCM")
        self.out: list[tuple[str, bytes, bytes | None, int]] = []
        self.service = NotifyService(
            tokens={},
            states={},
            providers={"APNS": self.apns, "FCM": self.fcm},
            sealer=self.sealer,
            send=self._send,
            policy=PushPolicy(rtc_voip_push_daily_quota=quota),
            now_ms=lambda: T0,
            commands_topic="commands",
            digest_topic="digest",
            push_topic="tasks",
            user_devices={},
            to_gateway_topic="to-gateway",
        )

    async def _send(self, topic: str, key: bytes, value: bytes | None, partition: int) -> None:
        self.out.append((topic, key, value, partition))

    async def register(
        self, user: str, device: str, provider: str, token: str, voip: str = "", **kw: Any
    ) -> None:
        key = DeviceKey("t", user, device)
        cmd = DeviceTokenCommand(
            request_id=f"r-{device}",
            tenant_id="t",
            user_id=user,
            device_id=device,
            provider=provider,
            sealed_token=self.sealer.seal(token, key.encode()),
            token_fingerprint=self.sealer.fingerprint(token),
            sealed_voip_token=self.sealer.seal(voip, voip_aad(key)) if voip else b"",
            voip_token_fingerprint=self.sealer.fingerprint(voip) if voip else "",
            at_ms=T0,
            **kw,
        )
        await self.service.on_command(key.encode(), encode(cmd), 3)

    async def call(self, callee: str, call_id: str) -> None:
        invite = RtcSignalDown(
            conversation_id="d:alice:bob", from_user_id="alice", from_device_id="pc",
            call_id=call_id, signal_type="invite",
        )  # fmt: skip
        task = voip_task("t", callee, invite, caller_connection_shard=7, callee_connection_shard=11)
        await self.service.on_push_task(task.key.encode(), encode(task), 3)
        await asyncio.gather(*self.service.inflight)

    def relays(self) -> list[tuple[str, int, str, str]]:
        out = []
        for topic, _, value, partition in self.out:
            if topic == "to-gateway" and value is not None:
                relay = decode_rtc_relay(value)
                assert relay.connection_shard == partition
                s = relay.signal
                out.append((relay.target_user_id, partition, s.signal_type, s.reason))
        return out

    def counted(self, result: str) -> float:
        value = self.service.registry.get_sample_value(
            "notify_voip_pushes_total", {"result": result}
        )
        return value or 0.0

    def stored(self, user: str, device: str) -> DeviceToken | None:
        return decode_device_token(self.service.tokens.get(DeviceKey("t", user, device).encode()))


async def _bob(rig: Rig) -> None:
    await rig.register("bob", "phone", "APNS", PHONE_ALERT, PHONE_VOIP, capabilities=("voip",))
    await rig.register("bob", "tablet", "FCM", TABLET_FCM, capabilities=("voip",))
    await rig.register("bob", "desktop", "APNS", DESKTOP_ALERT)  # no voip capability


async def test_a_call_wakes_every_voip_device_of_the_callee_through_the_right_token() -> None:
    rig = Rig()
    await _bob(rig)
    index = rig.service.user_devices[user_devices_key("t", "bob")]
    assert decode_user_devices(index) == ("desktop", "phone", "tablet")
    await rig.call("bob", "c1")
    [(apns_token, apns_note)] = rig.apns.sent
    [(fcm_token, fcm_note)] = rig.fcm.sent
    assert (apns_token, fcm_token) == (PHONE_VOIP, TABLET_FCM)  # never the alert token
    for note in (apns_note, fcm_note):
        assert note.voip and note.badge == 0 and note.custom["call_id"] == "c1"
        assert note.custom["caller_user_id"] == "alice"
    assert rig.relays() == []  # something rings: the caller hears nothing yet
    assert rig.counted("push") == 2.0


async def test_the_same_call_again_is_not_pushed_twice_and_not_answered_offline() -> None:
    rig = Rig()
    await _bob(rig)
    await rig.call("bob", "c1")
    await rig.call("bob", "c1")  # a re-invite, or the task replayed after a crash
    assert len(rig.apns.sent) == len(rig.fcm.sent) == 1
    assert rig.relays() == [] and rig.counted("duplicate") == 2.0


async def test_over_the_quota_nothing_is_pushed_and_both_ends_hear_offline() -> None:
    rig = Rig(quota=1)
    await _bob(rig)
    await rig.call("bob", "c1")
    await rig.call("bob", "c2")
    assert [n.custom["call_id"] for _, n in rig.apns.sent + rig.fcm.sent] == ["c1", "c1"]
    assert rig.relays() == [
        ("alice", 7, "cancel", "offline"),  # the caller, at its ConnectionShard
        ("bob", 11, "cancel", "offline"),  # the callee's node: stops its ring timer
    ]
    assert rig.counted("over_quota") == 2.0


async def test_a_callee_without_a_voip_device_is_answered_offline() -> None:
    rig = Rig()
    await rig.register("carol", "phone", "APNS", PHONE_ALERT)
    await rig.call("carol", "c1")
    await rig.call("nobody", "c2")
    assert rig.apns.sent == [] and rig.fcm.sent == []
    assert [(t, r) for t, _, _, r in rig.relays()] == [
        ("alice", "offline"),
        ("carol", "offline"),
        ("alice", "offline"),
        ("nobody", "offline"),
    ]
    assert rig.counted("no_voip_device") == 2.0


async def test_a_dead_pushkit_token_is_deleted_alone_and_the_alert_token_stays() -> None:
    rig = Rig(200, ProviderResult(410, "Unregistered"))
    await _bob(rig)
    await rig.call("bob", "c1")
    deletes = [decode_command(v) for t, _, v, _ in rig.out if t == "commands" and v is not None]
    [delete] = deletes
    assert isinstance(delete, DeviceTokenDelete) and delete.scope == "voip"
    stored = rig.stored("bob", "phone")
    assert stored is not None and delete.token_fingerprint == stored.voip_token_fingerprint
    await rig.service.on_command(DeviceKey("t", "bob", "phone").encode(), encode(delete), 3)
    kept = rig.stored("bob", "phone")
    assert kept is not None and kept.token_fingerprint == stored.token_fingerprint
    assert (kept.sealed_voip_token, kept.voip_token_fingerprint, kept.capabilities) == (b"", "", ())
    _, key, value, _ = rig.out[-1]
    assert key == DeviceKey("t", "bob", "phone").encode()
    digest = decode_digest(value)
    assert digest is not None and "voip" not in digest.capabilities
    await rig.call("bob", "c2")  # only the FCM tablet can still be woken
    assert [t for t, _ in rig.apns.sent] == [PHONE_VOIP]
    assert [n.custom["call_id"] for _, n in rig.fcm.sent] == ["c1", "c2"]


async def test_deleting_a_device_takes_it_out_of_the_index() -> None:
    rig = Rig()
    await _bob(rig)
    for device in ("phone", "tablet", "desktop"):
        key = DeviceKey("t", "bob", device)
        delete = DeviceTokenDelete(
            request_id=f"d-{device}", tenant_id="t", user_id="bob", device_id=device,
            reason="client",
        )  # fmt: skip
        await rig.service.on_command(key.encode(), encode(delete), 3)
    assert user_devices_key("t", "bob") not in rig.service.user_devices
    await rig.call("bob", "c1")
    assert rig.apns.sent == [] and rig.fcm.sent == []
