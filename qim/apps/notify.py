"""The notify app: the NotificationService (spec 16) as Faust agents over RocksDB tables.

Run with `faust -A qim.apps.notify worker`. Here Faust's own shape fits (direction.md 7): two
agents, each on a topic co-partitioned by the user's mailbox shard, maintaining RocksDB tables
whose changelogs are compacted topics (Faust's default for tables).

* agent ``device_token_commands`` on ``qim.device-token-commands`` -> table ``device_tokens``
  (key (tenant, user, device) -> the DeviceToken with the token AES-GCM sealed) and the
  compacted ``qim.device-token-digest`` (no token; tombstone on delete), and the per-user
  index ``user_devices`` ((tenant, user) -> the device ids with a token);
* agent ``push_tasks`` on ``qim.push-tasks`` -> table ``push_device_state`` (per device: the
  dedup set, last minute's sends, open merge windows, the day's VoIP count) and the providers
  (APNs HTTP/2, FCM HTTP v1). A ``voip`` task (13.5.2: an RTC invite for a callee with no
  online device, from the callee's ConnectionNode) fans out through ``user_devices`` to the
  callee's VoIP-capable devices under ``rtc_voip_push_daily_quota``; a call that woke none is
  answered ``cancel{reason=offline}`` on ``qim.to-gateway``. A timer turns ended merge
  windows into ``flush`` tasks on the same topic; another sweeps ``device_tokens`` for tokens
  idle past ``push_token_inactive_days`` and sends their ``inactive`` deletes to the command
  topic (16.6 GC).

Pages: ``POST /v1/device-tokens`` and ``DELETE /v1/device-tokens/{device_id}/`` are the
device-token management API (``qim.agents.notify.registration``); ``/notify`` is the
service's status, ``/metrics`` its Prometheus series, ``/healthz`` Faust's readiness.

Providers are configured by the environment (``qim.agents.notify.providers``); the local stack
and the tests point them at the stand-ins of ``qim.devstack.push_standins``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from faust import Table
from faust.web import Request, Response, View
from redis.asyncio import Redis

from qim.agents.notify.providers import (
    ApnsConfig,
    ApnsProvider,
    FcmConfig,
    FcmProvider,
    PushProvider,
)
from qim.agents.notify.registration import MAX_BODY_BYTES, RegistrationApi
from qim.agents.notify.sealing import load_sealer
from qim.agents.notify.service import NotifyService
from qim.apps.base import ROCKSDB_OPTIONS, install_metrics_page, make_app
from qim.auth.config import AuthConfig, load_keyring
from qim.auth.service import AuthService
from qim.core.notify.rules import PushPolicy
from qim.params import Settings
from qim.schemas.records.notify import DeviceKey
from qim.streams.topics import DEVICE_TOKEN_COMMANDS, DEVICE_TOKEN_DIGEST, PUSH_TASKS, TO_GATEWAY

app = make_app("qim-notify")
log = logging.getLogger(__name__)
_settings = Settings.load()
PARTITIONS = _settings.mailbox_shard_count


def _raw_topic(name: str) -> Any:
    return app.topic(
        name,
        partitions=PARTITIONS,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )


commands_topic = _raw_topic(DEVICE_TOKEN_COMMANDS.name)
push_topic = _raw_topic(PUSH_TASKS.name)


class AckedTable(Table[Any, Any]):
    """A Faust table that keeps the future of each key's latest changelog record, so a
    caller can wait for Kafka's ack of a write (:meth:`written`) before acting on it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.pending_writes: dict[Any, Any] = {}

    def send_changelog(
        self, partition: int | None, key: Any, value: Any, *a: Any, **kw: Any
    ) -> Any:
        fut = super().send_changelog(partition, key, value, *a, **kw)
        self.pending_writes[key] = fut

        def forget(done: Any, k: Any = key) -> None:
            if self.pending_writes.get(k) is done:
                del self.pending_writes[k]

        fut.add_done_callback(forget)
        return fut

    async def written(self, key: Any) -> None:
        """Back once the latest write of ``key`` is in Kafka (raises if it failed)."""
        fut = self.pending_writes.get(key)
        if fut is not None:
            await fut


def _raw_table(name: str, help_text: str, cls: type[Any] | None = None) -> Any:
    kwargs: dict[str, Any] = {
        "partitions": PARTITIONS,
        "key_type": bytes,  # bytes -> Faust's "raw" serializer for the store and the changelog
        "value_type": bytes,
        "options": dict(ROCKSDB_OPTIONS),
        "help": help_text,
    }
    if cls is None:
        return app.Table(name, **kwargs)
    return app.tables.add(cls(app, name=name, beacon=app.tables.beacon, **kwargs))


device_tokens = _raw_table("device_tokens", "DeviceToken per (tenant, user, device), sealed")
push_device_state = _raw_table(
    "push_device_state",
    "dedup / rate / merge state and the day's VoIP count per device",
    AckedTable,
)
user_devices = _raw_table("user_devices", "device ids with a stored token per (tenant, user)")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _providers() -> dict[str, PushProvider]:
    """The configured providers. One whose credentials are missing or unreadable is left out
    (logged): its pushes fail as ``provider_not_configured``, the worker still serves the
    rest (registration, the other provider, the digest)."""
    found: dict[str, PushProvider] = {}
    try:
        apns = ApnsConfig.from_env(os.environ)
        if apns is not None:
            found["APNS"] = ApnsProvider(apns)
    except (OSError, KeyError, ValueError):
        log.exception("APNs provider not configured")
    try:
        fcm = FcmConfig.from_env(os.environ)
        if fcm is not None:
            found["FCM"] = FcmProvider(fcm)
    except (OSError, KeyError, ValueError):
        log.exception("FCM provider not configured")
    return found


async def _send(topic: str, key: bytes, value: bytes | None, partition: int) -> None:
    """One record to an explicit partition, back once Kafka acknowledged it (acks=all)."""
    await app.producer.send_and_wait(topic, key, value, partition, None, None)


def _policy() -> PushPolicy:
    return PushPolicy(
        push_merge_window=int(_settings.push_merge_window),
        push_dedup_ttl=int(_settings.push_dedup_ttl),
        push_rate_per_user_per_min=int(_settings.push_rate_per_user_per_min),
        push_rate_per_conversation_per_min=int(_settings.push_rate_per_conversation_per_min),
        push_retry_max_attempts=int(_settings.push_retry_max_attempts),
        push_quiet_hours=_settings.push_quiet_hours,
        push_token_inactive_days=int(_settings.push_token_inactive_days),
        rtc_voip_push_daily_quota=int(_settings.rtc_voip_push_daily_quota),
    )


sealer = load_sealer()
service = NotifyService(
    tokens=device_tokens,
    states=push_device_state,
    providers={},
    sealer=sealer,
    send=_send,
    policy=_policy(),
    now_ms=_now_ms,
    commands_topic=DEVICE_TOKEN_COMMANDS.name,
    digest_topic=DEVICE_TOKEN_DIGEST.name,
    push_topic=PUSH_TASKS.name,
    user_devices=user_devices,
    to_gateway_topic=TO_GATEWAY.name,
    durable=push_device_state.written,
    max_inflight=int(os.environ.get("QIM_NOTIFY_MAX_INFLIGHT", "256")),
)


def _partition_of(key: DeviceKey) -> int:
    return key.partition(
        virtual_bucket_count=_settings.virtual_bucket_count,
        mailbox_shard_count=_settings.mailbox_shard_count,
    )


class _Api:
    """The registration API, made on first use (it needs the running loop for Redis)."""

    api: RegistrationApi | None = None

    @classmethod
    def get(cls) -> RegistrationApi:
        if cls.api is None:
            keyring, _ = load_keyring()
            redis = Redis.from_url(os.environ.get("QIM_REDIS_URL", "redis://127.0.0.1:16379/0"))
            auth = AuthService(redis, keyring, AuthConfig.from_env())
            cls.api = RegistrationApi(
                auth, sealer, _produce_command, partition_of=_partition_of, now_ms=_now_ms
            )
        return cls.api


async def _produce_command(key: bytes, value: bytes, partition: int) -> None:
    await _send(DEVICE_TOKEN_COMMANDS.name, key, value, partition)


@app.task  # type: ignore[untyped-decorator]
async def _start_providers() -> None:
    """Providers open HTTP clients on the worker's loop."""
    service.set_providers(_providers())


@app.agent(commands_topic)
async def device_token_commands(stream: Any) -> None:
    """Register / overwrite / delete a DeviceToken and publish its digest."""
    async for event in stream.events():
        await service.on_command(event.key, event.value, event.message.partition)


@app.agent(push_topic)
async def push_tasks(stream: Any) -> None:
    """PushTasks -> dedup / merge / rate -> the provider."""
    async for event in stream.events():
        await service.on_push_task(event.key, event.value, event.message.partition)


class _Recovered:
    """The active partitions whose open merge windows were re-learnt from the table."""

    partitions: frozenset[Any] = frozenset()


@app.timer(interval=0.5)  # type: ignore[untyped-decorator]
async def flush_merge_windows() -> None:
    """Ended merge windows become ``flush`` tasks in their device's partition. After a
    (re)assignment, once the tables are recovered, the windows open in them are re-learnt."""
    if app.tables.recovery.completed.is_set():  # type: ignore[attr-defined]
        actives = frozenset(app.assignor.assigned_actives())
        if actives != _Recovered.partitions:
            _Recovered.partitions = actives
            found = service.recover_due(lambda k: _partition_of(DeviceKey.decode(k)))
            if found:
                log.info("re-learnt %d open merge windows from push_device_state", found)
    for key, partition, due in service.due_flushes(_now_ms()):
        service.due.pop(key, None)
        await _send(PUSH_TASKS.name, key, service.flush_task(key, due), partition)


TOKEN_GC_INTERVAL_S = float(os.environ.get("QIM_NOTIFY_TOKEN_GC_INTERVAL_S", "3600"))
"""How often the 16.6 inactive-token GC sweeps this worker's tokens (a day of precision is
plenty for ``push_token_inactive_days``; tests set it short)."""


@app.timer(interval=TOKEN_GC_INTERVAL_S)  # type: ignore[untyped-decorator]
async def gc_inactive_tokens() -> None:
    """Tokens idle past ``push_token_inactive_days`` become ``inactive`` delete commands."""
    for key, value in service.inactive_sweep(_now_ms()):
        await _send(DEVICE_TOKEN_COMMANDS.name, key, value, _partition_of(DeviceKey.decode(key)))


def _json(web: View, status: int, body: dict[str, Any]) -> Response:
    return web.json(body, status=status)


@app.page("/v1/device-tokens")
class DeviceTokens(View):
    """``POST``: register or overwrite the caller's device token."""

    async def post(self, request: Request) -> Response:
        raw = await request.read()
        if len(raw) > MAX_BODY_BYTES:
            return _json(self, 413, {"error": "PAYLOAD_TOO_LARGE", "detail": "body_too_large"})
        try:
            body: object = json.loads(raw)
        except ValueError:
            body = None
        status, answer = await _Api.get().register(request.headers, body)
        return _json(self, status, answer)


@app.page("/v1/device-tokens/{device_id}/")
class DeviceTokenOf(View):
    """``DELETE``: the caller deletes its device's token."""

    async def delete(self, request: Request, device_id: str) -> Response:
        status, answer = await _Api.get().delete(request.headers, device_id, request.query)
        return _json(self, status, answer)


@app.page("/notify")
async def notify_status(web: View, request: Request) -> Response:
    return web.json(service.status())


install_metrics_page(app, "/metrics", lambda: service.registry)
