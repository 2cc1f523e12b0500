"""Sending one push through its provider, with the 16.5 retries and the 16.6 token verdicts.

:func:`deliver` opens the sealed token in memory only, builds the provider-neutral
:class:`Notification` (absolute badge = ``total_unread`` of the task's UserBadgeState, 16.3;
custom fields ``total_mention``, ``muted_unread``, ``badge_projection_mailbox_seq``), sends,
and retries only 5xx and timeouts (:func:`qim.core.notify.rules.classify`) after 1 s / 4 s /
16 s, ``push_retry_max_attempts`` times. It returns the verdict; the caller deletes the token
on ``delete_token`` (APNs 410 / BadDeviceToken, FCM UNREGISTERED / INVALID_ARGUMENT) and never
on a 5xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from qim.agents.notify.providers import Notification, ProviderResult, PushProvider
from qim.agents.notify.sealing import SealError, TokenSealer, voip_aad
from qim.core.notify.rules import Outcome, Send, classify, retry_delay_ms
from qim.core.notify.voip import voip_fields
from qim.schemas.records.notify import DeviceToken, PushTask

__all__ = ["Delivery", "deliver", "notification_for", "voip_notification"]

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one push ended: the verdict, attempts made, and the last provider answer."""

    outcome: Outcome
    attempts: int
    last: ProviderResult


def notification_for(send: Send, task: PushTask | None) -> Notification:
    """The provider-neutral push of ``send``; ``task`` (the last PushTask) gives the text."""
    custom: dict[str, str | int] = {
        "badge_projection_mailbox_seq": send.badge_projection_mailbox_seq,
        "total_mention": send.total_mention,
        "muted_unread": send.muted_unread,
        "mailbox_seq": send.mailbox_seq,
    }
    if send.conversation_id:
        custom["conversation_id"] = send.conversation_id
    if send.event_id:
        custom["event_id"] = send.event_id
    e2ee = task is not None and task.e2ee
    if e2ee:
        custom["e2ee"] = 1  # 16.7: the client decrypts and rewrites the notification
    if send.kind == "badge":
        return Notification(
            silent=True, title="", body="", badge=send.total_unread, collapse_id="", custom=custom
        )
    preview = task.preview_or_placeholder if task is not None else ""
    body = (
        f"{send.merged_count} new messages" if send.merged_count > 1 else (preview or "New message")
    )
    return Notification(
        silent=False,
        title="New message",
        body=body,
        badge=send.total_unread,
        collapse_id=send.collapse_id,
        custom=custom,
        thread_id=send.conversation_id,
        data_only=e2ee,
    )


def voip_notification(task: PushTask) -> Notification:
    """A call's VoIP push (13.5.2): the call's fields, no alert text, no badge."""
    return Notification(
        silent=False,
        title="",
        body="",
        badge=0,
        collapse_id="",
        custom=dict(voip_fields(task)),
        voip=True,
    )


async def deliver(
    token: DeviceToken,
    note: Notification,
    *,
    providers: Mapping[str, PushProvider],
    sealer: TokenSealer,
    max_attempts: int,
    sleep: Sleep = asyncio.sleep,
) -> Delivery:
    """Send ``note`` to the device of ``token``; retry 5xx / timeouts, report the verdict.

    A VoIP note goes to an APNs device's PushKit token, to an FCM device's one token."""
    provider = providers.get(token.provider)
    if provider is None:
        return Delivery("failed", 0, ProviderResult(None, "provider_not_configured"))
    try:
        if note.voip and token.provider == "APNS":
            plain = sealer.open(token.sealed_voip_token, voip_aad(token.key))
        else:
            plain = sealer.open(token.sealed_token, token.key.encode())
    except SealError:
        return Delivery("failed", 0, ProviderResult(None, "token_does_not_open"))
    attempts = 0
    retries = 0
    while True:
        attempts += 1
        result = await provider.send(plain, token.bundle_env, note)
        outcome = classify(token.provider, result.status, result.reason)
        if outcome != "retry":
            return Delivery(outcome, attempts, result)
        if retries >= max_attempts:
            return Delivery("failed", attempts, result)
        retries += 1
        await sleep(retry_delay_ms(retries) / 1000.0)
