"""RTC_SIGNAL on the ConnectionNode (spec 13.5, AT-63/65): ring everywhere, one answer wins.

The thin shell over :class:`~qim.core.transient.RingTimers`. Both directions pass here:

* **outgoing** (a local device sends RTC_SIGNAL): the frame must name a conversation, a target
  and a ``call_id`` and carry a known ``signal_type`` (else PERMISSION_DENIED naming why);
  the payload size was checked by the codec (``rtc_signal_max_bytes``). A callee device's
  ``accept`` / ``reject`` / ``busy`` stops this node's ring timer for the call and cancels the
  user's other devices here (``answered_elsewhere`` / ``rejected_elsewhere``). Then the router
  sends it to the ConversationWriter, which checks both users' membership and relays it to the
  target's ConnectionShard -- also when the target has no online device, so a call to an
  offline callee passes the same membership check before anything wakes a phone;
* **incoming** (an :class:`~qim.schemas.records.transient.RtcRelay` on one of this node's
  shards): written to every live device of the target (13.5.1), DEGRADED ones skipped
  (transient first, 11.3). An ``invite`` that reached a device starts ringing; one that
  reached none because every device is DEGRADED answers the caller ``cancel{offline}``. An
  ``invite`` for a callee with no connection here (13.5.2: this node owns the callee's
  ConnectionShard, so its registry is the callee's every connection) becomes one ``voip``
  PushTask on ``qim.push-tasks`` for the NotificationService, which pushes the callee's
  VoIP-capable devices (APNs VoIP / FCM high priority, ``rtc_voip_push_daily_quota``), and
  the ring timer starts as if it rang: the caller hears nothing at once, the woken device
  answers on the online path, and ``rtc_ring_timeout`` cancels an unanswered call. When no
  device could be pushed (none registered ``voip``, all over the quota) the service answers
  the caller ``cancel{reason=offline}`` and stops this timer the same way (topology.md
  decision 34). Without a push topic (a node with no NotificationService) the caller is
  answered ``offline`` at once, as before. The caller's ``cancel`` / ``bye`` stops the ringing;
* **timeout**: past ``rtc_ring_timeout`` the callee's devices get ``cancel{reason=timeout}``
  and so does the caller, through ``qim.to-gateway`` at the caller's ConnectionShard.

No call state beyond the timers (13.5.3), none of it durable, and nothing touches a mailbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qim.core.notify.voip import voip_task
from qim.core.push import FlowState
from qim.core.transient import RingTimers, answer_reason
from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.schemas.frames import Error, ErrorCode, Frame
from qim.schemas.frames.rtc import SIGNAL_TYPES, RtcSignal, RtcSignalDown
from qim.schemas.records.notify import DeviceKey, encode
from qim.schemas.records.transient import RtcRelay, encode_transient

if TYPE_CHECKING:
    from qim.gateway.presence_directory import PresenceDirectory
    from qim.gateway.routing.forwarder import RequestForwarder
    from qim.gateway.transport.connection import Connection

__all__ = ["RtcSignalling"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Outgoing:
    relay: RtcRelay

    @property
    def key(self) -> bytes:
        return self.relay.key

    @property
    def value(self) -> bytes:
        return encode_transient(self.relay)

    @property
    def partition(self) -> int:
        return self.relay.partition


@dataclass(frozen=True, slots=True)
class _PushTaskOut:
    key: bytes
    value: bytes
    partition: int


class RtcSignalling:
    """This node's half of RTC signalling; ``start()`` / ``stop()`` run the ring clock."""

    def __init__(
        self,
        registry: DeviceRegistry[Connection],
        directory: PresenceDirectory | None,
        forwarder: RequestForwarder,
        *,
        topic: str,
        shard_of: Callable[[str, str], int],
        ring_timeout_ms: int,
        clock_ms: Callable[[], int],
        tick_s: float = 0.25,
        push_topic: str = "",
        push_partition_of: Callable[[DeviceKey], int] | None = None,
    ) -> None:
        self._registry = registry
        self._directory = directory
        self._forwarder = forwarder
        self._topic = topic
        self._shard_of = shard_of
        self._clock_ms = clock_ms
        self._tick_s = tick_s
        self._push_topic = push_topic
        self._push_partition_of = push_partition_of
        self.voip_handed = 0  # invites handed to offline push (13.5.2)
        self.timers = RingTimers(ring_timeout_ms)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._ring_clock(), name="rtc-ring-timers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- a local device's signal ----------------------------------------------------------------

    def outgoing(self, conn: Connection, frame: Frame) -> bool:
        """True when the frame was answered here and must not be forwarded."""
        signal = frame.body
        assert isinstance(signal, RtcSignal)
        grant = conn.session.grant
        if grant is None:
            return True
        rid = frame.header.request_id
        problem = _problem(signal)
        if problem:
            error = Error(code=int(ErrorCode.PERMISSION_DENIED), request_id=rid, detail=problem)
            conn.apply([Send(error, request_id=rid, version=conn.session.version)])
            return True
        tenant, user = grant.tenant_id, grant.user_id
        reason = answer_reason(signal.signal_type)
        if reason is not None:  # a callee device answered: the others stop ringing
            self.timers.stop(tenant, signal.call_id, user)
            cancel = RtcSignalDown(
                conversation_id=signal.conversation_id,
                from_user_id=user,
                from_device_id=grant.device_id,
                call_id=signal.call_id,
                signal_type="cancel",
                reason=reason,
            )
            self._deliver(tenant, user, cancel, skip_device=grant.device_id)
        if self._push_topic:
            return False  # an offline callee is pushed by its node (module doc)
        directory = self._directory
        if directory is not None and directory.ready.is_set():
            now = self._clock_ms()
            if not directory.view.online_devices(tenant, signal.target_user_id, now):
                offline = RtcSignalDown(
                    conversation_id=signal.conversation_id,
                    from_user_id=signal.target_user_id,
                    call_id=signal.call_id,
                    signal_type="cancel",
                    reason="offline",
                )
                conn.apply([Send(offline, request_id=rid, version=conn.session.version)])
                return True
        return False

    # -- a relayed signal for a user of this node -----------------------------------------------

    def incoming(self, relay: RtcRelay) -> int:
        """Write the signal to every live device of its target; how many were written."""
        signal, tenant, target = relay.signal, relay.tenant_id, relay.target_user_id
        written = self._deliver(tenant, target, signal)
        if signal.signal_type == "invite":
            if written or (not self._online(tenant, target) and self._voip_push(relay)):
                self.timers.invite(
                    tenant, signal.call_id, target,
                    caller=signal.from_user_id, caller_device=signal.from_device_id,
                    conversation_id=signal.conversation_id, now_ms=self._clock_ms(),
                )  # fmt: skip
            else:
                self._tell(tenant, signal.from_user_id, signal, target, "offline")
        elif signal.signal_type in ("cancel", "bye"):
            self.timers.stop(tenant, signal.call_id, target)
        return written

    # -- internals ------------------------------------------------------------------------------

    def _online(self, tenant: str, user: str) -> bool:
        """Whether ``user`` has a connection here that is not closing: a DEGRADED one is
        online (its transient frame was dropped, 11.3; the old ``offline`` answer stands), a
        closing one is going away and its device is pushed."""
        for slot in self._registry.devices(tenant, user).values():
            conn, session = slot.conn, slot.conn.session
            if session.grant is not None and not conn.closing and not session.closed:
                return True
        return False

    def _voip_push(self, relay: RtcRelay) -> bool:
        """Hand an invite for a callee with no online device to offline push (13.5.2); False
        when this node has no push topic or its request queue is full."""
        if not self._push_topic or self._push_partition_of is None:
            return False
        signal = relay.signal
        task = voip_task(
            relay.tenant_id,
            relay.target_user_id,
            signal,
            caller_connection_shard=self._shard_of(relay.tenant_id, signal.from_user_id),
            callee_connection_shard=relay.connection_shard,
        )
        outgoing = _PushTaskOut(task.key.encode(), encode(task), self._push_partition_of(task.key))

        def produced(exc: BaseException | None) -> None:
            if exc is not None:
                log.warning("VoIP PushTask for %s not produced: %r", relay.target_user_id, exc)

        if not self._forwarder.submit(outgoing, produced, topic=self._push_topic):
            log.warning("VoIP PushTask for %s dropped: request queue full", relay.target_user_id)
            return False
        self.voip_handed += 1
        return True

    def _deliver(
        self, tenant: str, user: str, signal: RtcSignalDown, *, skip_device: str = ""
    ) -> int:
        written = 0
        for device, slot in self._registry.devices(tenant, user).items():
            conn = slot.conn
            session = conn.session
            if device == skip_device or session.grant is None or conn.closing or session.closed:
                continue
            if session.flow_state is FlowState.DEGRADED:
                continue
            conn.apply([Send(signal, request_id=0, version=session.version)])
            written += 1
        return written

    def _tell(self, tenant: str, user: str, about: RtcSignalDown, callee: str, reason: str) -> None:
        """The server's ``cancel{reason}`` to ``user`` on whichever node owns them."""
        cancel = RtcSignalDown(
            conversation_id=about.conversation_id,
            from_user_id=callee,
            call_id=about.call_id,
            signal_type="cancel",
            reason=reason,
        )
        relay = RtcRelay(
            tenant_id=tenant,
            target_user_id=user,
            connection_shard=self._shard_of(tenant, user),
            signal=cancel,
        )

        def produced(exc: BaseException | None) -> None:
            if exc is not None:
                log.warning("RTC cancel for %s not produced: %r", user, exc)

        if not self._forwarder.submit(_Outgoing(relay), produced, topic=self._topic):
            log.warning("RTC cancel for %s dropped: request queue full", user)

    async def _ring_clock(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                for ringing in self.timers.due(self._clock_ms()):
                    cancel = RtcSignalDown(
                        conversation_id=ringing.conversation_id,
                        from_user_id=ringing.caller,
                        from_device_id=ringing.caller_device,
                        call_id=ringing.call_id,
                        signal_type="cancel",
                        reason="timeout",
                    )
                    self._deliver(ringing.tenant_id, ringing.callee, cancel)
                    self._tell(ringing.tenant_id, ringing.caller, cancel, ringing.callee, "timeout")
            except Exception:
                log.exception("RTC ring clock failed")


def _problem(signal: RtcSignal) -> str:
    """Why the signal cannot be relayed ("" when it can)."""
    if signal.signal_type not in SIGNAL_TYPES:
        return f"RTC_SIGNAL signal_type {signal.signal_type!r} is not one of {SIGNAL_TYPES}"
    if not signal.target_user_id or not signal.call_id:
        return "RTC_SIGNAL needs target_user_id and call_id"
    return ""
