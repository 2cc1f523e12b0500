"""Which device connections of a user are live, and who gets kicked (§5.4.4, §15.2.2).

Pure: the node asks ``admit`` after AuthService granted a session_epoch and before AUTH_OK.
A ConnectionShard is per *user*, so all of a user's devices are on one ConnectionNode and this
registry is the single local authority the spec wants for "replace only the same device_id"
and the device cap (§5.2: why ConnectionShard is per user).

Rules:

* same device_id again: the larger session_epoch wins, never first-come (§15.2.2). The live
  one is kicked with ``KICKED{reason=replaced, replaced_by_device=<that device>}`` (case
  26.5.2 names replaced_by_device for this case too). A *smaller or equal* epoch loses: the
  newcomer is the stale one and gets the same KICKED instead of AUTH_OK;
* different device_ids coexist;
* more than ``max_devices_per_user`` (8): the least recently active device is kicked with
  ``KICKED{reason=replaced, replaced_by_device=<the new device>}``; ties go to the smaller
  device_id so the choice is deterministic.

``ConnKey`` is whatever the node uses to find a connection; the registry only compares it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

__all__ = ["REPLACED", "Admission", "DeviceRegistry", "DeviceSlot", "Kick"]

REPLACED: Final = "replaced"

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class DeviceSlot(Generic[K]):
    """The live connection of one device."""

    conn: K
    session_epoch: int
    last_active_ms: int


@dataclass(frozen=True, slots=True)
class Kick(Generic[K]):
    """Send ``KICKED{reason, replaced_by_device}`` to ``conn`` and close it."""

    conn: K
    device_id: str
    reason: str
    replaced_by_device: str | None


@dataclass(frozen=True, slots=True)
class Admission(Generic[K]):
    """``admitted`` False: the newcomer's epoch is stale and ``kicks`` holds the newcomer."""

    admitted: bool
    kicks: tuple[Kick[K], ...] = field(default=())


class DeviceRegistry(Generic[K]):
    """Live device slots per (tenant_id, user_id) on this node."""

    def __init__(self, max_devices_per_user: int = 8) -> None:
        if max_devices_per_user < 1:
            raise ValueError("max_devices_per_user must be >= 1")
        self.max_devices_per_user = max_devices_per_user
        self._users: dict[tuple[str, str], dict[str, DeviceSlot[K]]] = {}

    def admit(
        self, tenant_id: str, user_id: str, device_id: str, session_epoch: int, conn: K, now_ms: int
    ) -> Admission[K]:
        """Register ``conn`` as the device's live connection, or refuse a stale epoch."""
        devices = self._users.setdefault((tenant_id, user_id), {})
        kicks: list[Kick[K]] = []
        current = devices.get(device_id)
        if current is not None:
            if session_epoch <= current.session_epoch:
                return Admission(False, (Kick(conn, device_id, REPLACED, device_id),))
            kicks.append(Kick(current.conn, device_id, REPLACED, device_id))
        elif len(devices) >= self.max_devices_per_user:
            victim = min(devices, key=lambda d: (devices[d].last_active_ms, d))
            kicks.append(Kick(devices.pop(victim).conn, victim, REPLACED, device_id))
        devices[device_id] = DeviceSlot(conn, session_epoch, now_ms)
        return Admission(True, tuple(kicks))

    def touch(self, tenant_id: str, user_id: str, device_id: str, conn: K, now_ms: int) -> None:
        """Record activity (any valid inbound frame) for least-recently-active eviction."""
        slot = self._slot(tenant_id, user_id, device_id)
        if slot is not None and slot.conn == conn and now_ms > slot.last_active_ms:
            slot.last_active_ms = now_ms

    def release(self, tenant_id: str, user_id: str, device_id: str, conn: K) -> bool:
        """Forget ``conn``; True when it was the device's live connection (tombstone it then).

        A replaced connection's release returns False: its successor owns the slot and the
        presence key, so no tombstone may be written for it.
        """
        devices = self._users.get((tenant_id, user_id))
        slot = None if devices is None else devices.get(device_id)
        if devices is None or slot is None or slot.conn != conn:
            return False
        del devices[device_id]
        if not devices:
            del self._users[(tenant_id, user_id)]
        return True

    def current(self, tenant_id: str, user_id: str, device_id: str) -> DeviceSlot[K] | None:
        return self._slot(tenant_id, user_id, device_id)

    def devices(self, tenant_id: str, user_id: str) -> dict[str, DeviceSlot[K]]:
        """A copy of the user's live devices."""
        return dict(self._users.get((tenant_id, user_id), {}))

    def __iter__(self) -> Iterator[tuple[str, str, str, DeviceSlot[K]]]:
        for (tenant, user), devices in self._users.items():
            for device, slot in devices.items():
                yield tenant, user, device, slot

    def __len__(self) -> int:
        return sum(len(d) for d in self._users.values())

    def _slot(self, tenant_id: str, user_id: str, device_id: str) -> DeviceSlot[K] | None:
        devices = self._users.get((tenant_id, user_id))
        return None if devices is None else devices.get(device_id)
