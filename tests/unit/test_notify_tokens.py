"""Device-token lifecycle (spec 16.6, AT-115 / AT-117): the pure GC rules, and the
NotificationService's command and delivery paths over in-memory tables and a fake provider
(deletion on a provider's "token dead" answer, last_success_at, the GC with its re-check)."""

from __future__ import annotations

import asyncio

import pytest

from qim.agents.notify.providers import Notification, ProviderResult
from qim.agents.notify.sealing import TokenSealer
from qim.agents.notify.service import NotifyService
from qim.core.notify.rules import PushPolicy
from qim.core.notify.tokens import (
    DAY_MS,
    INACTIVE_REASON,
    inactive_deletes,
    should_record_success,
    token_inactive,
)
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceToken,
    DeviceTokenCommand,
    DeviceTokenDelete,
    DeviceTokenSuccess,
    PushTask,
    decode_command,
    decode_device_token,
    encode,
)

T0 = 1_800_000_000_000


def _token(device: str, last_success_at: int) -> DeviceToken:
    return DeviceToken(
        tenant_id="t",
        user_id="u",
        device_id=device,
        provider="APNS",
        sealed_token=b"x",
        token_fingerprint=f"fp-{device}",
        last_success_at=last_success_at,
    )


def test_a_token_idle_91_days_is_inactive_and_90_days_is_not_yet() -> None:
    assert token_inactive(T0, T0 + 91 * DAY_MS, 90)
    assert not token_inactive(T0, T0 + 90 * DAY_MS, 90)


def test_success_is_recorded_at_most_once_a_day() -> None:
    assert should_record_success(T0, T0 + DAY_MS)
    assert not should_record_success(T0, T0 + DAY_MS - 1)


def test_the_sweep_deletes_only_idle_tokens_in_key_order_with_the_gc_reason() -> None:
    now = T0 + 91 * DAY_MS
    tokens = [_token("b", T0), _token("fresh", now - DAY_MS), _token("a", T0 - 5)]
    deletes = inactive_deletes(tokens, now_ms=now, inactive_days=90)
    assert [(d.device_id, d.reason, d.token_fingerprint) for d in deletes] == [
        ("a", INACTIVE_REASON, "fp-a"),
        ("b", INACTIVE_REASON, "fp-b"),
    ]
    assert deletes == inactive_deletes(reversed(tokens), now_ms=now, inactive_days=90)


class FakeProvider:
    """Answers with the queued results, then 200; records what it was asked."""

    name = "APNS"

    def __init__(self, *answers: ProviderResult) -> None:
        self.answers = list(answers)
        self.sent: list[str] = []

    async def send(self, token: str, bundle_env: str, note: Notification) -> ProviderResult:
        self.sent.append(token)
        return self.answers.pop(0) if self.answers else ProviderResult(200)

    async def aclose(self) -> None:
        return None


class Rig:
    """A NotifyService over dicts; ``out`` is every record it produced."""

    def __init__(self, provider: FakeProvider, provider_name: str = "APNS") -> None:
        self.now = T0
        self.sealer = TokenSealer.parse(TokenSealer.generate_line())
        self.out: list[tuple[str, bytes, bytes | None, int]] = []
        self.provider_name = provider_name
        self.service = NotifyService(
            tokens={},
            states={},
            providers={provider_name: provider},
            sealer=self.sealer,
            send=self._send,
            policy=PushPolicy(),
            now_ms=lambda: self.now,
            commands_topic="commands",
            digest_topic="digest",
            push_topic="tasks",
        )

    async def _send(self, topic: str, key: bytes, value: bytes | None, partition: int) -> None:
        self.out.append((topic, key, value, partition))

    def key(self, device: str) -> bytes:
        return DeviceKey("t", "u", device).encode()

    async def register(self, device: str, token: str, at_ms: int) -> None:
        key = DeviceKey("t", "u", device)
        cmd = DeviceTokenCommand(
            request_id=f"r-{device}-{at_ms}",
            tenant_id="t",
            user_id="u",
            device_id=device,
            provider=self.provider_name,
            sealed_token=self.sealer.seal(token, key.encode()),
            token_fingerprint=self.sealer.fingerprint(token),
            at_ms=at_ms,
        )
        await self.service.on_command(key.encode(), encode(cmd), 3)

    def stored(self, device: str) -> DeviceToken | None:
        return decode_device_token(self.service.tokens.get(self.key(device)))

    def produced(self, topic: str) -> list[tuple[bytes, bytes | None]]:
        return [(k, v) for t, k, v, _ in self.out if t == topic]

    async def push(self, device: str, event_id: str) -> None:
        task = PushTask(
            tenant_id="t",
            user_id="u",
            device_id=device,
            event_id=event_id,
            mailbox_seq=1,
            conversation_id=f"c-{event_id}",
        )
        await self.service.on_push_task(self.key(device), encode(task), 3)
        await asyncio.gather(*self.service.inflight)

    def commands(self) -> list[object]:
        return [decode_command(v) for _, v in self.produced("commands") if v is not None]


@pytest.mark.parametrize(
    ("provider", "answer", "reason"),
    [
        ("APNS", ProviderResult(410, "Unregistered"), "APNS 410 Unregistered"),
        ("APNS", ProviderResult(400, "BadDeviceToken"), "APNS 400 BadDeviceToken"),
        ("FCM", ProviderResult(404, "UNREGISTERED"), "FCM 404 UNREGISTERED"),
        ("FCM", ProviderResult(400, "INVALID_ARGUMENT"), "FCM 400 INVALID_ARGUMENT"),
    ],
)
async def test_a_token_the_provider_calls_dead_is_deleted_with_a_tombstone(
    provider: str, answer: ProviderResult, reason: str
) -> None:
    rig = Rig(FakeProvider(answer), provider)
    await rig.register("phone", "aa" * 32, T0)
    await rig.push("phone", "e1")
    [delete] = rig.commands()
    assert isinstance(delete, DeviceTokenDelete)
    stored = rig.stored("phone")
    assert stored is not None
    assert (delete.reason, delete.token_fingerprint) == (reason, stored.token_fingerprint)
    await rig.service.on_command(rig.key("phone"), encode(delete), 3)
    assert rig.stored("phone") is None
    assert rig.produced("digest")[-1] == (rig.key("phone"), None)
    counted = rig.service.registry.get_sample_value(
        "notify_device_token_commands_total", {"op": "delete", "result": provider}
    )
    assert counted == 1.0


async def test_a_5xx_never_deletes_the_token() -> None:
    provider = FakeProvider(ProviderResult(503, "ServiceUnavailable"))
    rig = Rig(provider)
    rig.service.policy = PushPolicy(push_retry_max_attempts=0)  # no retries: one answer
    await rig.register("phone", "aa" * 32, T0)
    await rig.push("phone", "e1")
    assert provider.sent == ["aa" * 32]
    assert rig.commands() == [] and rig.stored("phone") is not None


async def test_a_delivery_records_last_success_at_once_a_day() -> None:
    rig = Rig(FakeProvider())
    await rig.register("phone", "aa" * 32, T0)
    rig.now = T0 + 2 * DAY_MS
    await rig.push("phone", "e1")
    [success] = rig.commands()
    assert isinstance(success, DeviceTokenSuccess) and success.at_ms == rig.now
    await rig.service.on_command(rig.key("phone"), encode(success), 3)
    stored = rig.stored("phone")
    assert stored is not None and stored.last_success_at == rig.now
    rig.now += 1_000
    await rig.push("phone", "e2")  # the same day: delivered, nothing more to record
    assert len(rig.commands()) == 1


async def test_gc_deletes_a_token_idle_past_push_token_inactive_days() -> None:
    rig = Rig(FakeProvider())
    await rig.register("old", "aa" * 32, T0)
    await rig.register("new", "bb" * 32, T0 + 80 * DAY_MS)
    rig.now = T0 + 91 * DAY_MS
    [(key, value)] = rig.service.inactive_sweep(rig.now)
    assert key == rig.key("old")
    await rig.service.on_command(key, value, 3)
    assert rig.stored("old") is None and rig.stored("new") is not None
    assert rig.produced("digest")[-1] == (rig.key("old"), None)
    counted = rig.service.registry.get_sample_value(
        "notify_device_token_commands_total", {"op": "delete", "result": INACTIVE_REASON}
    )
    assert counted == 1.0


async def test_gc_keeps_a_token_refreshed_after_the_sweep_saw_it_idle() -> None:
    rig = Rig(FakeProvider())
    await rig.register("phone", "aa" * 32, T0)
    rig.now = T0 + 91 * DAY_MS
    [(key, value)] = rig.service.inactive_sweep(rig.now)
    await rig.register("phone", "aa" * 32, rig.now)  # the app started: same token, fresh
    digests = len(rig.produced("digest"))
    await rig.service.on_command(key, value, 3)
    assert rig.stored("phone") is not None
    assert len(rig.produced("digest")) == digests  # no tombstone
    kept = rig.service.registry.get_sample_value(
        "notify_device_token_commands_total", {"op": "delete", "result": "kept_active"}
    )
    assert kept == 1.0
