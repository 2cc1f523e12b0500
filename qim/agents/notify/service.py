"""The NotificationService's agent bodies: device-token commands and PushTasks (spec 16).

The Faust app (``qim.apps.notify``) owns the tables and topics and calls these from its agents,
so every table write happens inside the agent's current event (Faust writes the changelog to
the event's partition, which is the user's mailbox shard for every topic here).

* :meth:`NotifyService.on_command`: register / overwrite / delete a DeviceToken, then publish
  the ``device_token_digest`` record (a tombstone on delete) and wait for Kafka's ack before
  the agent moves on. At-least-once: a crash before the offset commit replays the command,
  which lands on the same state (an overwrite is idempotent; a delete of nothing publishes the
  tombstone again). A conditional delete (``token_fingerprint`` set, a provider's 410) only
  deletes if the stored token is still the one that failed; a GC delete (reason
  ``inactive``, from :meth:`NotifyService.inactive_sweep`) only if the token is still idle past
  ``push_token_inactive_days`` when it lands (16.6). A ``success`` command (a delivered push,
  at most once a day per token) moves ``last_success_at``.
* :meth:`NotifyService.on_push_task`: no token -> nothing (16.1.1); else the pure rules of
  :mod:`qim.core.notify.rules` (dedup, merge, rate) on the device's state table, and each push
  to send is handed to a delivery task (retries 1/4/16 s without stalling the partition). A
  ``kind="flush"`` task closes the device's ended merge windows (and ended quiet hours, 16.4,
evaluated in the DeviceToken's ``timezone``); the app's timer produces them
  for the windows :attr:`NotifyService.due` knows of.

Crash safety (16.2.4, AT-108): the dedup set is written to the table, and each delivery
awaits :attr:`NotifyService.durable` (the app: Kafka's ack of that changelog record) before
the push leaves. A kill -9 at any point then replays from the last committed offset onto a
table whose recovered dedup set covers every push that ever reached a provider: no second
notification. The price is at-most-once for the pushes in flight at the kill (durable, not yet
sent): at most ``max_inflight`` of them, bounded by :attr:`NotifyService.slots`; a lost wake-up
loses no message (16, first principle). Merge windows that were open at the kill are found
again from the table (:meth:`NotifyService.recover_due`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from qim.agents.notify.delivery import Delivery, deliver, notification_for, voip_notification
from qim.agents.notify.providers import PushProvider
from qim.agents.notify.sealing import TokenSealer
from qim.core.notify.rules import DeviceState, PushPolicy, Send, admit, flush_due, next_flush_at
from qim.core.notify.tokens import (
    INACTIVE_REASON,
    inactive_deletes,
    should_record_success,
    token_inactive,
)
from qim.core.notify.voip import VoipVerdict, admit_voip, voip_devices
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceToken,
    DeviceTokenCommand,
    DeviceTokenDelete,
    DeviceTokenSuccess,
    PushTask,
    decode_command,
    decode_device_token,
    decode_push_task,
    decode_user_devices,
    digest_of,
    encode,
    encode_user_devices,
    user_devices_key,
)
from qim.schemas.records.transient import RtcRelay, encode_transient

__all__ = ["NotifyService", "decode_state", "encode_state"]

log = logging.getLogger(__name__)

Send_ = Callable[[str, bytes, bytes | None, int], Awaitable[None]]
"""(topic, key, value or None for a tombstone, partition) -> once Kafka acknowledged it."""

Durable = Callable[[bytes], Awaitable[None]]
"""device key -> once the latest write of its ``states`` entry is acknowledged by Kafka."""


async def _already_durable(key: bytes) -> None:
    return None


_STATE_ENCODER = msgspec.msgpack.Encoder()
_STATE_DECODER = msgspec.msgpack.Decoder(DeviceState)


def encode_state(state: DeviceState) -> bytes:
    return _STATE_ENCODER.encode(state)


def decode_state(raw: bytes | None) -> DeviceState:
    return DeviceState() if raw is None else _STATE_DECODER.decode(raw)


@dataclass
class NotifyService:
    """Everything the two agents share; tables are the Faust tables (bytes -> bytes)."""

    tokens: MutableMapping[bytes, bytes]
    states: MutableMapping[bytes, bytes]
    providers: Mapping[str, PushProvider]
    sealer: TokenSealer
    send: Send_
    policy: PushPolicy
    now_ms: Callable[[], int]
    commands_topic: str
    digest_topic: str
    push_topic: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    due: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """device key -> (partition, when its earliest merge window ends)."""
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    last_task: dict[bytes, PushTask] = field(default_factory=dict)
    user_devices: MutableMapping[bytes, bytes] = field(default_factory=dict)
    """(tenant, user) -> the device ids with a stored token (the ``user_devices`` table,
    written by the command agent in the same partition): a ``voip`` task's fan-out."""
    to_gateway_topic: str = ""
    """Where a call that woke no device is answered ``cancel{reason=offline}`` (13.5.2)."""
    durable: Durable = _already_durable
    max_inflight: int = 256
    """Deliveries at once (retries included); the agent waits for a slot. Also the bound on
    the pushes a kill -9 can lose (durable in the dedup set, not yet at the provider)."""

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.max_inflight)
        self.providers_ready = asyncio.Event()
        if self.providers:
            self.providers_ready.set()
        self.commands = Counter(
            "notify_device_token_commands",
            "Device-token commands applied, by op and result.",
            ["op", "result"],
            registry=self.registry,
        )
        self.tasks = Counter(
            "notify_push_tasks",
            "PushTasks consumed, by what became of them.",
            ["result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "offline_push_latency_seconds",
            "Message commit -> the provider accepted the push (24.1.8 offline_push_latency_p95).",
            buckets=(0.25, 0.5, 1, 2, 3, 5, 8, 15, 30, 60),
            registry=self.registry,
        )
        Gauge(
            "offline_push_accepted_ratio",
            "Pushes the provider accepted / pushes handed to it (24.1.8; NaN before any).",
            registry=self.registry,
        ).set_function(lambda: self._ratio("delivered"))
        Gauge(
            "device_token_invalid_ratio",
            "Pushes the provider answered 'token invalid' (deleted) / pushes handed to it "
            "(24.1.8; NaN before any).",
            registry=self.registry,
        ).set_function(lambda: self._ratio("delete_token"))
        self.verdicts: dict[str, int] = {}
        self.voip = Counter(
            "notify_voip_pushes",
            "A call's VoIP pushes (13.5.2), per device: pushed, duplicate (same call again), "
            "over_quota (rtc_voip_push_daily_quota), and per call no_voip_device.",
            ["result"],
            registry=self.registry,
        )
        self.pushes = Counter(
            "offline_push_attempts",
            "Pushes handed to a provider, by provider, kind and final verdict (24.1.8 "
            "offline_push_accepted_ratio = delivered / all).",
            ["provider", "kind", "outcome"],
            registry=self.registry,
        )

    def set_providers(self, providers: Mapping[str, PushProvider]) -> None:
        """The providers, once their clients are open on the worker's loop; deliveries wait
        for this (a restarted worker replays PushTasks before its app task opened them, and
        they must not fail as ``provider_not_configured``)."""
        self.providers = providers
        self.providers_ready.set()

    # -- device tokens ---------------------------------------------------------------------

    async def on_command(self, key: bytes, value: bytes, partition: int) -> None:
        try:
            command = decode_command(value)
            if command.key.encode() != key:
                raise ValueError("record key does not match the command")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            self.commands.labels("unknown", "undecodable").inc()
            log.warning("undecodable device-token command at partition %d", partition)
            return
        if isinstance(command, DeviceTokenCommand):
            await self._register(key, command, partition)
        elif isinstance(command, DeviceTokenSuccess):
            self._success(key, command)
        else:
            await self._delete(key, command, partition)

    def _success(self, key: bytes, cmd: DeviceTokenSuccess) -> None:
        stored = decode_device_token(self.tokens.get(key))
        if (
            stored is None
            or stored.token_fingerprint != cmd.token_fingerprint
            or cmd.at_ms <= stored.last_success_at
        ):
            self.commands.labels("success", "stale").inc()
            return
        self.tokens[key] = encode(
            msgspec.structs.replace(stored, last_success_at=cmd.at_ms, last_failure_code="")
        )
        self.commands.labels("success", "recorded").inc()

    async def _register(self, key: bytes, cmd: DeviceTokenCommand, partition: int) -> None:
        previous = decode_device_token(self.tokens.get(key))
        token = DeviceToken(
            tenant_id=cmd.tenant_id,
            user_id=cmd.user_id,
            device_id=cmd.device_id,
            provider=cmd.provider,
            sealed_token=cmd.sealed_token,
            token_fingerprint=cmd.token_fingerprint,
            bundle_env=cmd.bundle_env,
            client_platform=cmd.client_platform,
            app_version=cmd.app_version,
            locale=cmd.locale,
            timezone=cmd.timezone,
            capabilities=cmd.capabilities,
            sealed_voip_token=cmd.sealed_voip_token,
            voip_token_fingerprint=cmd.voip_token_fingerprint,
            registered_at=cmd.at_ms,
            last_success_at=cmd.at_ms,
        )
        # The overwrite replaces the old token in the same write: one message never rings the
        # device twice through an old and a new token (16.6 refresh).
        self.tokens[key] = encode(token)
        self._index(token.tenant_id, token.user_id, token.device_id, present=True)
        await self.send(self.digest_topic, key, encode(digest_of(token)), partition)
        self.commands.labels("register", "overwrite" if previous else "new").inc()

    def _index(self, tenant_id: str, user_id: str, device_id: str, *, present: bool) -> None:
        ikey = user_devices_key(tenant_id, user_id)
        devices = set(decode_user_devices(self.user_devices.get(ikey)))
        if (device_id in devices) == present:
            return
        if present:
            devices.add(device_id)
        else:
            devices.discard(device_id)
        if devices:
            self.user_devices[ikey] = encode_user_devices(tuple(devices))
        elif ikey in self.user_devices:
            del self.user_devices[ikey]

    async def _delete(self, key: bytes, cmd: DeviceTokenDelete, partition: int) -> None:
        stored = decode_device_token(self.tokens.get(key))
        if cmd.scope == "voip":  # APNs refused the PushKit token: only it goes (13.5.2)
            if stored is None or stored.voip_token_fingerprint != cmd.token_fingerprint:
                self.commands.labels("delete_voip", "kept_newer_token").inc()
                return
            kept = msgspec.structs.replace(
                stored,
                sealed_voip_token=b"",
                voip_token_fingerprint="",
                capabilities=tuple(c for c in stored.capabilities if c != "voip"),
            )
            self.tokens[key] = encode(kept)
            await self.send(self.digest_topic, key, encode(digest_of(kept)), partition)
            self.commands.labels("delete_voip", "deleted").inc()
            return
        if (
            stored is not None
            and cmd.token_fingerprint
            and stored.token_fingerprint != cmd.token_fingerprint
        ):
            self.commands.labels("delete", "kept_newer_token").inc()
            return
        if (
            stored is not None
            and cmd.reason == INACTIVE_REASON
            and not token_inactive(
                stored.last_success_at, cmd.at_ms, self.policy.push_token_inactive_days
            )
        ):  # a success or a re-registration landed after the sweep saw it idle
            self.commands.labels("delete", "kept_active").inc()
            return
        if stored is not None:
            del self.tokens[key]
        dev = DeviceKey.decode(key)
        self._index(dev.tenant_id, dev.user_id, dev.device_id, present=False)
        await self.send(self.digest_topic, key, None, partition)
        self.commands.labels("delete", cmd.reason.split(" ", 1)[0] or "client").inc()

    # -- push tasks ------------------------------------------------------------------------

    def _state(self, key: bytes) -> DeviceState:
        return decode_state(self.states.get(key))

    def _save(self, key: bytes, state: DeviceState, partition: int) -> None:
        self.states[key] = encode_state(state)
        when = next_flush_at(state)
        if when is None:
            self.due.pop(key, None)
        else:
            self.due[key] = (partition, when)

    async def on_push_task(self, key: bytes, value: bytes, partition: int) -> None:
        try:
            task = decode_push_task(value)
            if task.key.encode() != key:
                raise ValueError("record key does not match the task")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            self.tasks.labels("undecodable").inc()
            return
        if task.kind == "voip":
            await self._voip(task, partition)
            return
        token = decode_device_token(self.tokens.get(key))
        if token is None:
            self.tasks.labels("no_token").inc()
            return
        # A delivery slot before the state is written: a kill -9 can then only lose pushes that
        # hold a slot (admitted and durable, not yet at the provider), at most max_inflight.
        await self.slots.acquire()
        try:
            sends = self._admit(key, token, task, partition)
        except BaseException:
            self.slots.release()
            raise
        if not sends:
            self.slots.release()
        for n, send in enumerate(sends):
            if n:  # a flush with a merged alert and a quiet-hours badge: one slot each
                await self.slots.acquire()
            self._spawn(key, token, send, partition)

    def _admit(self, key: bytes, token: DeviceToken, task: PushTask, partition: int) -> list[Send]:
        now = self.now_ms()
        if task.kind == "flush":
            state, sends = flush_due(self._state(key), now_ms=now, policy=self.policy)
            self._save(key, state, partition)
            self.tasks.labels("flush").inc()
        else:
            state, sends = admit(
                self._state(key),
                token_fingerprint=token.token_fingerprint,
                kind=task.kind,
                event_id=task.event_id,
                conversation_id=task.conversation_id,
                mailbox_seq=task.mailbox_seq,
                total_unread=task.total_unread,
                total_mention=task.total_mention,
                muted_unread=task.muted_unread,
                badge_projection_mailbox_seq=task.badge_projection_mailbox_seq,
                now_ms=now,
                policy=self.policy,
                mention_type=task.mention_type,
                timezone=token.timezone,
            )
            self._save(key, state, partition)
            self.last_task[key] = task
            self.tasks.labels("sent" if sends else "held_or_duplicate").inc()
        return sends

    def _spawn(self, key: bytes, token: DeviceToken, send: Send, partition: int) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(key, token, send, partition))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _deliver(self, key: bytes, token: DeviceToken, send: Send, partition: int) -> None:
        try:
            await self._deliver_durably(key, token, send, partition)
        finally:
            self.slots.release()

    async def _deliver_durably(
        self, key: bytes, token: DeviceToken, send: Send, partition: int
    ) -> None:
        note = notification_for(send, self.last_task.get(key))
        try:
            # The dedup set that admitted this push is in Kafka before the push leaves: a
            # replay after a crash finds it and never notifies twice (16.2.4).
            await self.durable(key)
        except Exception:  # the changelog write failed: not sending is the safe side
            log.exception("dedup state not durable; push not sent")
            self.pushes.labels(token.provider, send.kind, "not_durable").inc()
            return
        await self.providers_ready.wait()
        try:
            result: Delivery = await deliver(
                token,
                note,
                providers=self.providers,
                sealer=self.sealer,
                max_attempts=self.policy.push_retry_max_attempts,
            )
        except Exception:  # a provider bug must not kill the worker; the push is best effort
            log.exception("push delivery crashed")
            self.pushes.labels(token.provider, send.kind, "crashed").inc()
            return
        self.pushes.labels(token.provider, send.kind, result.outcome).inc()
        self.verdicts[result.outcome] = self.verdicts.get(result.outcome, 0) + 1
        task = self.last_task.get(key)
        if result.outcome == "delivered" and task is not None and task.committed_at > 0:
            self.latency.observe(max(0.0, (self.now_ms() - task.committed_at) / 1000.0))
        now = self.now_ms()
        if result.outcome == "delivered" and should_record_success(token.last_success_at, now):
            success = DeviceTokenSuccess(
                request_id=f"success:{send.event_id}",
                tenant_id=token.tenant_id,
                user_id=token.user_id,
                device_id=token.device_id,
                token_fingerprint=token.token_fingerprint,
                at_ms=now,
            )
            await self.send(self.commands_topic, key, encode(success), partition)
        if result.outcome == "delete_token":
            delete = DeviceTokenDelete(
                request_id=f"provider:{send.event_id}",
                tenant_id=token.tenant_id,
                user_id=token.user_id,
                device_id=token.device_id,
                reason=f"{token.provider} {result.last.status} {result.last.reason}",
                token_fingerprint=token.token_fingerprint,
                at_ms=self.now_ms(),
            )
            await self.send(self.commands_topic, key, encode(delete), partition)

    # -- a call for a callee with no online device (13.5.2) -----------------------------------

    async def _voip(self, task: PushTask, partition: int) -> None:
        """Fan a ``voip`` task out to the callee's VoIP-capable devices (each: dedup, the
        daily quota, then the push); a call that woke nothing is answered ``offline``."""
        self.tasks.labels("voip").inc()
        devices = decode_user_devices(
            self.user_devices.get(user_devices_key(task.tenant_id, task.user_id))
        )
        stored = (
            decode_device_token(
                self.tokens.get(DeviceKey(task.tenant_id, task.user_id, d).encode())
            )
            for d in devices
        )
        targets = voip_devices(t for t in stored if t is not None)
        now = self.now_ms()
        verdicts: list[VoipVerdict] = []
        for token in targets:
            key = token.key.encode()
            state, verdict = admit_voip(
                self._state(key),
                token_fingerprint=token.token_fingerprint,
                call_id=task.call_id,
                now_ms=now,
                policy=self.policy,
            )
            self._save(key, state, partition)  # before the push: a replay is a duplicate
            self.voip.labels(verdict).inc()
            verdicts.append(verdict)
            if verdict == "push":
                self._spawn_voip(key, token, task, partition)
        if not targets:
            self.voip.labels("no_voip_device").inc()
        if not any(v in ("push", "duplicate") for v in verdicts):
            await self._call_unreachable(task)

    async def _call_unreachable(self, task: PushTask) -> None:
        """``cancel{reason=offline}`` to the caller and to the callee's node (which started
        the ring timer when it handed the call over): nothing could ring."""
        if not self.to_gateway_topic:
            return
        ends = (
            (task.caller_user_id, task.caller_connection_shard, task.user_id, ""),
            (task.user_id, task.callee_connection_shard, task.caller_user_id,
             task.caller_device_id),
        )  # fmt: skip
        for target, shard, sender, sender_device in ends:
            relay = RtcRelay(
                tenant_id=task.tenant_id,
                target_user_id=target,
                connection_shard=shard,
                signal=RtcSignalDown(
                    conversation_id=task.conversation_id,
                    from_user_id=sender,
                    from_device_id=sender_device,
                    call_id=task.call_id,
                    signal_type="cancel",
                    reason="offline",
                ),
            )
            await self.send(self.to_gateway_topic, relay.key, encode_transient(relay), shard)

    def _spawn_voip(self, key: bytes, token: DeviceToken, task: PushTask, partition: int) -> None:
        job = asyncio.get_running_loop().create_task(
            self._deliver_voip(key, token, task, partition)
        )
        self.inflight.add(job)
        job.add_done_callback(self.inflight.discard)

    async def _deliver_voip(
        self, key: bytes, token: DeviceToken, task: PushTask, partition: int
    ) -> None:
        try:
            result = await deliver(
                token,
                voip_notification(task),
                providers=self.providers,
                sealer=self.sealer,
                max_attempts=self.policy.push_retry_max_attempts,
            )
        except Exception:
            log.exception("VoIP push delivery crashed")
            self.pushes.labels(token.provider, "voip", "crashed").inc()
            return
        self.pushes.labels(token.provider, "voip", result.outcome).inc()
        self.verdicts[result.outcome] = self.verdicts.get(result.outcome, 0) + 1
        if result.outcome != "delete_token":
            return
        apns = token.provider == "APNS"  # the PushKit token died; FCM's one token did
        delete = DeviceTokenDelete(
            request_id=f"provider:voip:{task.call_id}",
            tenant_id=token.tenant_id,
            user_id=token.user_id,
            device_id=token.device_id,
            reason=f"{token.provider} {result.last.status} {result.last.reason}",
            token_fingerprint=token.voip_token_fingerprint if apns else token.token_fingerprint,
            scope="voip" if apns else "",
            at_ms=self.now_ms(),
        )
        await self.send(self.commands_topic, key, encode(delete), partition)

    def inactive_sweep(self, now_ms: int) -> list[tuple[bytes, bytes]]:
        """(key, DeviceTokenDelete) of every token of this worker's partitions idle past
        ``push_token_inactive_days`` (16.6 GC); the app produces them to the command topic
        so the deletion and its tombstone happen in the agent, like any other delete."""
        tokens = [t for raw in self.tokens.values() if (t := decode_device_token(raw))]
        deletes = inactive_deletes(
            tokens, now_ms=now_ms, inactive_days=self.policy.push_token_inactive_days
        )
        return [(d.key.encode(), encode(d)) for d in deletes]

    def _ratio(self, outcome: str) -> float:
        total = sum(self.verdicts.values())
        return self.verdicts.get(outcome, 0) / total if total else math.nan

    def recover_due(self, partition_of: Callable[[bytes], int]) -> int:
        """Re-learn the merge windows still open in ``states`` (a restarted worker's
        :attr:`due` is empty, and a window whose tasks were committed before a crash would
        otherwise never flush). Returns how many devices have one."""
        found = 0
        for key, raw in list(self.states.items()):
            when = next_flush_at(decode_state(raw))
            if when is not None and key not in self.due:
                self.due[key] = (partition_of(key), when)
                found += 1
        return found

    def due_flushes(self, now_ms: int) -> list[tuple[bytes, int, int]]:
        """(key, partition, due) of every device whose merge window ended."""
        return [(k, p, t) for k, (p, t) in sorted(self.due.items()) if t <= now_ms]

    def flush_task(self, key: bytes, due: int) -> bytes:
        dev = DeviceKey.decode(key)
        return encode(
            PushTask(
                tenant_id=dev.tenant_id,
                user_id=dev.user_id,
                device_id=dev.device_id,
                event_id=f"flush:{due}",
                mailbox_seq=0,
                kind="flush",
            )
        )

    def status(self) -> dict[str, Any]:
        return {
            "providers": sorted(self.providers),
            "pending_merge_windows": len(self.due),
            "deliveries_in_flight": len(self.inflight),
        }
