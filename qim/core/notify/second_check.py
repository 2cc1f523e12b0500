"""The second check for online devices (16.1.2, PD-1): per device, entries awaiting evidence.

The online bitmap and the presence cache are filters, not authorities: a device that looks
online may be a zombie. So every alert PushTask the planner would have made for an *online*
wakeable device is held here instead of sent, keyed ``(tenant_id, user_id, device_id)``, in the
15.1.5 :class:`~qim.core.wheel.TimingWheel` (lazy: one slot per device, the real deadline
re-checked when the slot comes due). What happens to a held task:

* APPLIED evidence of **that device** (``PING.last_applied_mailbox_seq`` /
  ``PULL_MAILBOX.acked_seq`` >= its ``mailbox_seq``) -> dropped; evidence is never borrowed
  from another device;
* PUSHED evidence (its frame left the device's socket buffer) -> its deadline moves from
  ``push_grace_window`` to ``push_confirm_extended_window`` after materialization;
* the grace deadline passes with neither PUSHED nor APPLIED -> emitted, exactly like an
  offline device's task (PD-1: a zombie the bitmap calls online);
* the extended deadline passes without APPLIED -> emitted, unless DELIVERED evidence says the
  peer's TCP acknowledged the frame's bytes (16.1.2: "18 s pass and the connection is still
  alive, so the peer kernel acked the data -> delete the task"); a frame that sits unacked in
  the kernel for 18 s is a silently dead or stalled peer (26.5.6's negative case) and is
  pushed without waiting for ``tcp_user_timeout`` to close the socket;
* CONN_CLOSED of the device -> every held task above the device's APPLIED evidence is
  emitted at once (the zombie catch-up; the caller skips it when a newer session of the same
  device is already live).

Pure: time is an argument (the MailboxNode ticks it); nothing here reads a clock or does I/O.
In memory: a revoked shard's checks are gone, and a new owner starts with none (a known gap:
the spec's persisted table of pending confirmations is not built).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from qim.core.wheel import TimingWheel
from qim.schemas.records.notify import PushTask

__all__ = ["DeviceRef", "SecondCheck"]

DeviceRef: TypeAlias = tuple[str, str, str]
"""``(tenant_id, user_id, device_id)``: the key of 16.1.2, never the user alone."""

MAX_HELD_PER_DEVICE: Final = 64
"""Held tasks per device; past it the oldest go (the NotificationService merges a burst into
one "N new messages" anyway, 16.2): memory stays bounded under a flood to a zombie."""


@dataclass(slots=True)
class _Held:
    task: PushTask
    materialized_ms: int
    pushed: bool = False
    delivered: bool = False


@dataclass(slots=True)
class _Device:
    held: list[_Held] = field(default_factory=list)
    applied_seq: int = 0
    pushed_seq: int = 0
    delivered_seq: int = 0


class SecondCheck:
    """One MailboxShard's pending confirmations (module doc)."""

    def __init__(
        self,
        *,
        grace_ms: int,
        extended_ms: int,
        tick_ms: int = 250,
        slots: int = 512,
        now_ms: int = 0,
        max_held: int = MAX_HELD_PER_DEVICE,
    ) -> None:
        if grace_ms < 0 or extended_ms < grace_ms:
            raise ValueError("need 0 <= push_grace_window <= push_confirm_extended_window")
        self.grace_ms, self.extended_ms, self.max_held = grace_ms, extended_ms, max_held
        self._wheel: TimingWheel[DeviceRef] = TimingWheel(tick_ms, slots, now_ms=now_ms)
        self._devices: dict[DeviceRef, _Device] = {}
        self.confirmed_alive = 0  # held tasks dropped at the extended window (delivered)

    # -- inputs -------------------------------------------------------------------------------

    def hold(self, tasks: Iterable[PushTask], now_ms: int) -> None:
        """The alert tasks of online wakeable devices, just materialized at ``now_ms``."""
        touched: set[DeviceRef] = set()
        for task in tasks:
            ref = (task.tenant_id, task.user_id, task.device_id)
            device = self._devices.setdefault(ref, _Device())
            if task.mailbox_seq <= device.applied_seq:
                continue  # applied already
            seq = task.mailbox_seq
            device.held.append(
                _Held(task, now_ms, seq <= device.pushed_seq, seq <= device.delivered_seq)
            )
            touched.add(ref)
        for ref in touched:
            device = self._devices[ref]
            device.held.sort(key=lambda h: h.task.mailbox_seq)
            del device.held[: max(0, len(device.held) - self.max_held)]
            self._reschedule(ref, device)

    def evidence(
        self, ref: DeviceRef, *, pushed_seq: int, applied_seq: int, delivered_seq: int = 0
    ) -> None:
        """PUSHED / APPLIED / DELIVERED maxima reported for this device (0 = none)."""
        device = self._devices.get(ref)
        if device is None:  # nothing held: evidence only ever follows the fold it confirms
            return
        device.applied_seq = max(device.applied_seq, applied_seq)
        device.delivered_seq = max(device.delivered_seq, delivered_seq)
        device.pushed_seq = max(device.pushed_seq, pushed_seq, device.delivered_seq)
        device.held = [h for h in device.held if h.task.mailbox_seq > device.applied_seq]
        for h in device.held:
            h.pushed = h.pushed or h.task.mailbox_seq <= device.pushed_seq
            h.delivered = h.delivered or h.task.mailbox_seq <= device.delivered_seq
        if device.held:
            self._reschedule(ref, device)
        else:
            self._wheel.cancel(ref)
            del self._devices[ref]

    def closed(self, ref: DeviceRef, *, applied_seq: int) -> list[PushTask]:
        """CONN_CLOSED: the device is offline now; its unconfirmed tasks go out at once."""
        device = self._devices.pop(ref, None)
        self._wheel.cancel(ref)
        if device is None:
            return []
        floor = max(device.applied_seq, applied_seq)
        return [h.task for h in device.held if h.task.mailbox_seq > floor]

    def forget(self, ref: DeviceRef) -> None:
        """Drop what is held for the device without emitting (a newer session is live)."""
        self._devices.pop(ref, None)
        self._wheel.cancel(ref)

    # -- the tick -----------------------------------------------------------------------------

    def advance(self, now_ms: int) -> list[PushTask]:
        """The tasks whose window passed without APPLIED evidence, in (device, seq) order;
        delivered ones whose extended window passed are dropped (the connection is alive)."""
        out: list[PushTask] = []
        for ref in sorted(self._wheel.advance(now_ms)):
            device = self._devices.get(ref)
            if device is None:
                continue
            keep = []
            for h in device.held:
                if now_ms >= self._deadline(h):
                    if not h.delivered:
                        out.append(h.task)
                    self.confirmed_alive += h.delivered
                else:
                    keep.append(h)
            device.held = keep
            if keep:
                self._reschedule(ref, device)
            else:
                del self._devices[ref]
        return out

    # -- reading --------------------------------------------------------------------------------

    def pending(self, ref: DeviceRef) -> tuple[int, ...]:
        """The held ``mailbox_seq`` values of one device (tests, the status page)."""
        device = self._devices.get(ref)
        return () if device is None else tuple(h.task.mailbox_seq for h in device.held)

    def __len__(self) -> int:
        """Held tasks over all devices."""
        return sum(len(d.held) for d in self._devices.values())

    # -- internals -------------------------------------------------------------------------------

    def _deadline(self, h: _Held) -> int:
        return h.materialized_ms + (self.extended_ms if h.pushed else self.grace_ms)

    def _reschedule(self, ref: DeviceRef, device: _Device) -> None:
        if device.held:
            self._wheel.schedule(ref, min(self._deadline(h) for h in device.held))
