"""VoIP push for an RTC ``invite`` to a callee with no online device (spec 13.5.2, AT-64).

Pure: time is an argument. The NotificationService calls these for a ``kind="voip"``
PushTask (``qim.schemas.records.notify``), which names the callee, not a device:

* :func:`voip_task`: the task itself, built by the callee's ConnectionNode.
* :func:`voip_devices`: which of the callee's stored DeviceTokens can be woken for a call:
  the device registered the ``voip`` capability and a token that takes a VoIP push -- an APNs
  device its PushKit ``voip_token`` (a VoIP push to the alert token is refused by Apple,
  ``DeviceTokenNotForTopic``), an FCM device its one registration token (a high-priority
  data message). Sorted by device id, so the fan-out order is deterministic.
* :func:`admit_voip`: per device, on its :class:`~qim.core.notify.rules.DeviceState`:
  a call already pushed to this device within ``push_dedup_ttl`` (event id ``rtc:<call_id>``:
  a repeated invite, a replay after a worker crash) -> ``duplicate``; the device's count for
  the current UTC day at ``rtc_voip_push_daily_quota`` (:class:`PushPolicy`) ->
  ``over_quota`` (no push; counted in a metric by the caller); else ``push`` and the count
  moves. The count is per device and
  survives a token re-registration (:func:`qim.core.notify.rules._rescope`).
* :func:`voip_fields`: the payload's fields: the call, the caller and the conversation, and
  nothing of the badge (13.5.2: no UserBadgeState write, no badge change).

The day is the UTC calendar day (decision: the platforms' quotas are not in the device's
local time, and a fixed day boundary needs one counter, not 200 timestamps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Final, Literal

from qim.core.notify.rules import DeviceState, PushPolicy, _prune, _rescope
from qim.core.notify.tokens import DAY_MS
from qim.schemas.frames.rtc import RtcSignalDown
from qim.schemas.records.notify import VOIP_DEVICE, DeviceToken, PushTask

__all__ = [
    "VOIP_CAPABILITY",
    "VoipVerdict",
    "admit_voip",
    "voip_devices",
    "voip_event_id",
    "voip_fields",
    "voip_task",
    "voip_wakeable",
]

VOIP_CAPABILITY: Final = "voip"
VoipVerdict = Literal["push", "duplicate", "over_quota"]


def voip_event_id(call_id: str) -> str:
    """The dedup key of a call's VoIP push, per device (16.2.4 granularity)."""
    return f"rtc:{call_id}"


def voip_task(
    tenant_id: str,
    callee: str,
    invite: RtcSignalDown,
    *,
    caller_connection_shard: int,
    callee_connection_shard: int,
) -> PushTask:
    """The ``voip`` PushTask the callee's ConnectionNode produces for an ``invite`` that found
    no online device: the callee (all its devices, :data:`VOIP_DEVICE`), the call, and where a
    call nothing could wake is answered. Nothing of the signal payload (the SDP offer stays
    for the online path: 13.5.4, and a push payload is small)."""
    return PushTask(
        tenant_id=tenant_id,
        user_id=callee,
        device_id=VOIP_DEVICE,
        event_id=voip_event_id(invite.call_id),
        mailbox_seq=0,
        kind="voip",
        conversation_id=invite.conversation_id,
        counts_unread=False,
        call_id=invite.call_id,
        caller_user_id=invite.from_user_id,
        caller_device_id=invite.from_device_id,
        caller_connection_shard=caller_connection_shard,
        callee_connection_shard=callee_connection_shard,
    )


def voip_wakeable(token: DeviceToken) -> bool:
    """Whether a VoIP / FCM-high push can reach this device (module doc)."""
    if VOIP_CAPABILITY not in token.capabilities:
        return False
    if token.provider == "APNS":
        return bool(token.sealed_voip_token and token.voip_token_fingerprint)
    return token.provider == "FCM"


def voip_devices(tokens: Iterable[DeviceToken]) -> list[DeviceToken]:
    """The devices of one user a call may wake, by device id."""
    return sorted((t for t in tokens if voip_wakeable(t)), key=lambda t: t.device_id)


def admit_voip(
    state: DeviceState,
    *,
    token_fingerprint: str,
    call_id: str,
    now_ms: int,
    policy: PushPolicy,
) -> tuple[DeviceState, VoipVerdict]:
    """One call for one device: the new state and whether to push (module doc)."""
    state = _prune(_rescope(state, token_fingerprint), now_ms, policy)
    event_id = voip_event_id(call_id)
    if any(e == event_id for e, _ in state.seen):
        return state, "duplicate"
    day = now_ms // DAY_MS
    count = state.voip_count if state.voip_day == day else 0
    if count >= policy.rtc_voip_push_daily_quota:
        return replace(state, voip_day=day, voip_count=count), "over_quota"
    seen = tuple(sorted((*state.seen, (event_id, now_ms))))
    return replace(state, seen=seen, voip_day=day, voip_count=count + 1), "push"


def voip_fields(task: PushTask) -> dict[str, str]:
    """The VoIP payload's custom fields: what CallKit / the Android call screen needs to show
    the call and answer it once connected (``call_id`` goes into the client's ACCEPT)."""
    return {
        "type": "rtc_invite",
        "call_id": task.call_id,
        "caller_user_id": task.caller_user_id,
        "caller_device_id": task.caller_device_id,
        "conversation_id": task.conversation_id,
        "event_id": voip_event_id(task.call_id),
    }
