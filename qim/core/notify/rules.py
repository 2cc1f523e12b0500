"""Offline push rules as pure functions over plain data (spec 16.1, 16.2, 16.5, 16.6).

Time is always an argument (``now_ms``); nothing here reads a clock, does I/O or depends on
iteration order. The NotificationService keeps one :class:`DeviceState` per device in a
changelogged table and calls :func:`admit` for each PushTask and :func:`flush_due` when a
merge window ends; both return the new state and what to send.

The order of the rules on a PushTask (16.2 / 16.5):

1. **dedup** (16.2.4): ``(device_token, event_id)`` seen within ``push_dedup_ttl`` -> nothing,
   so a retry or a MailboxNode failover replay never makes a second notification. The token
   is part of the key: a re-registered device starts a fresh set.
2. badge-only tasks (a read elsewhere, a badge reaching 0, 16.3) are sent at once, silent.
3. **merge** (16.2.3): key (device, conversation). The first alert of a window goes out at
   once; later ones inside ``push_merge_window`` are counted and become ONE "N new messages"
   alert at the window's end (same collapse id, so it replaces the first in the tray).
4. **rate** (16.5): more than ``push_rate_per_user_per_min`` alerts for the device, or
   ``push_rate_per_conversation_per_min`` for one conversation, within a minute -> the alert
   becomes a silent badge update. Never dropped without a badge update (INV-56).

Quiet hours (16.4, ``push_quiet_hours``, off by default) come between 2 and 3: the daily
window is evaluated in the device's own ``DeviceToken.timezone`` (:func:`quiet_until`; an
empty or unknown zone reads as UTC). Inside it a normal alert becomes a silent badge update
(reason ``quiet_hours``: the badge moves, nothing sounds or shows) and opens no merge window;
``AT_ME`` / ``REPLY_ME`` break through (``quiet_hours_mentions_break_through``, default on;
decision: ``AT_ALL`` is not "@me" and stays quiet). Nothing is held back, so leaving the
window resends no backlog: :func:`flush_due` sends ONE badge update with the latest numbers
once the window has ended.

Retries (16.5): only 5xx and timeouts, ``push_retry_max_attempts`` with backoff 1 s / 4 s /
16 s; :func:`classify` maps a provider answer onto retry / delete the token / give up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from qim.params.values import QuietHours
from qim.schemas.hashing import blake3_digest, hash_input

__all__ = [
    "MINUTE_MS",
    "RETRY_BACKOFF_MS",
    "DeviceState",
    "Outcome",
    "PushPolicy",
    "Send",
    "admit",
    "classify",
    "collapse_id",
    "flush_due",
    "next_flush_at",
    "pd1_push",
    "quiet_until",
    "retry_delay_ms",
]

MINUTE_MS: Final = 60_000
RETRY_BACKOFF_MS: Final[tuple[int, ...]] = (1_000, 4_000, 16_000)
"""16.5: the waits before retry 1, 2, 3 (each 4x the last; further attempts keep 16 s x 4^k)."""

Outcome = Literal["delivered", "retry", "delete_token", "failed"]


@dataclass(frozen=True, slots=True)
class PushPolicy:
    """The B.5.2 values in force for a tenant (qim.params names, in ms / per minute)."""

    push_merge_window: int = 5_000
    push_dedup_ttl: int = 600_000
    push_rate_per_user_per_min: int = 10
    push_rate_per_conversation_per_min: int = 3
    push_retry_max_attempts: int = 3
    push_quiet_hours: QuietHours | None = None
    push_token_inactive_days: int = 90
    quiet_hours_mentions_break_through: bool = True
    rtc_voip_push_daily_quota: int = 200


@dataclass(frozen=True, slots=True)
class Window:
    """An open merge window of one conversation: until when, and how many it held back."""

    ends_at: int
    pending: int = 0
    last_event_id: str = ""
    last_mailbox_seq: int = 0
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    badge_projection_mailbox_seq: int = 0


@dataclass(frozen=True, slots=True)
class DeviceState:
    """Per device: the dedup set, the send times of the last minute, the open merge windows.

    ``token_fingerprint`` scopes the dedup set to one token (16.2.4 key (device_token,
    event_id)). Collections are tuples sorted by key so the state encodes deterministically.
    """

    token_fingerprint: str = ""
    seen: tuple[tuple[str, int], ...] = ()  # (event_id, first seen at)
    sent: tuple[tuple[str, int], ...] = ()  # (conversation_id, alert sent at), last minute
    windows: tuple[tuple[str, Window], ...] = ()  # conversation_id -> window
    quiet: Window | None = None  # alerts quieted until ``ends_at``; the latest badge numbers
    voip_day: int = 0  # the UTC day (ms // DAY) ``voip_count`` counts (13.5.2 daily quota)
    voip_count: int = 0  # VoIP pushes handed to the provider that day


@dataclass(frozen=True, slots=True)
class Send:
    """One push to hand to the provider. ``kind="badge"``: silent, only the badge numbers."""

    kind: Literal["alert", "badge"]
    event_id: str
    conversation_id: str
    collapse_id: str
    merged_count: int
    mailbox_seq: int
    total_unread: int
    total_mention: int
    muted_unread: int
    badge_projection_mailbox_seq: int
    reason: str = ""  # why an alert became a badge update ("rate_user", "rate_conversation")
    task: object = field(default=None, compare=False)


def collapse_id(conversation_id: str) -> str:
    """16.2.3: ``hash(conversation_id)``, 32 hex chars (APNs allows 64 bytes); the same for
    ``apns-collapse-id`` and FCM ``collapse_key``, so a merged alert replaces the first."""
    return blake3_digest(hash_input("collapse", conversation_id))[:16].hex()


_QUIET_BREAK_THROUGH: Final = frozenset({"AT_ME", "REPLY_ME"})


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name) if name else ZoneInfo("UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def quiet_until(quiet: QuietHours | None, timezone: str, now_ms: int) -> int | None:
    """16.4: the instant (ms) the daily quiet window ends if ``now_ms`` is inside it in the
    device's local time (``timezone``, an IANA name), else None. A window may wrap past
    midnight; ``start_minute == end_minute`` is an empty window."""
    if quiet is None or quiet.start_minute == quiet.end_minute:
        return None
    zone = _zone(timezone)
    local = datetime.fromtimestamp(now_ms / 1000, tz=UTC).astimezone(zone)
    minute = local.hour * 60 + local.minute
    start, end = quiet.start_minute, quiet.end_minute
    inside = start <= minute < end if start < end else (minute >= start or minute < end)
    if not inside:
        return None
    day = local.date() if minute < end else local.date() + timedelta(days=1)
    ends = datetime(day.year, day.month, day.day, end // 60, end % 60, tzinfo=zone)
    return int(ends.timestamp() * 1000)


def _rescope(state: DeviceState, token_fingerprint: str) -> DeviceState:
    """A new token starts a fresh dedup / rate / merge state; the device's 13.5.2 VoIP count
    of the day stays (the quota is per device: re-registering must not reset it)."""
    if state.token_fingerprint == token_fingerprint:
        return state
    return DeviceState(
        token_fingerprint=token_fingerprint, voip_day=state.voip_day, voip_count=state.voip_count
    )


def _prune(state: DeviceState, now_ms: int, policy: PushPolicy) -> DeviceState:
    seen = tuple((e, t) for e, t in state.seen if now_ms - t < policy.push_dedup_ttl)
    sent = tuple((c, t) for c, t in state.sent if now_ms - t < MINUTE_MS)
    # An ended window that held nothing back is over; keeping it would grow the device's
    # state (re-encoded on every task) with every conversation it was ever pushed for.
    windows = tuple((c, w) for c, w in state.windows if w.pending or now_ms < w.ends_at)
    return replace(state, seen=seen, sent=sent, windows=windows)


def _rate_refusal(state: DeviceState, conversation_id: str, policy: PushPolicy) -> str:
    if len(state.sent) >= policy.push_rate_per_user_per_min:
        return "rate_user"
    in_conv = sum(1 for c, _ in state.sent if c == conversation_id)
    if in_conv >= policy.push_rate_per_conversation_per_min:
        return "rate_conversation"
    return ""


def _alert_or_badge(
    state: DeviceState, send: Send, now_ms: int, policy: PushPolicy
) -> tuple[DeviceState, Send]:
    """Apply the 16.5 limits: an alert over the limit becomes a silent badge update."""
    refusal = _rate_refusal(state, send.conversation_id, policy)
    if refusal:
        return state, replace(send, kind="badge", reason=refusal)
    sent = tuple(sorted((*state.sent, (send.conversation_id, now_ms)), key=lambda s: (s[1], s[0])))
    return replace(state, sent=sent), send


def admit(
    state: DeviceState,
    *,
    token_fingerprint: str,
    kind: str,
    event_id: str,
    conversation_id: str,
    mailbox_seq: int,
    total_unread: int,
    total_mention: int,
    muted_unread: int,
    badge_projection_mailbox_seq: int,
    now_ms: int,
    policy: PushPolicy,
    mention_type: str = "NONE",
    timezone: str = "",
) -> tuple[DeviceState, list[Send]]:
    """One PushTask for this device: the new state and the pushes to send now (0 or 1).

    ``mention_type`` and ``timezone`` (the DeviceToken's) drive the quiet hours (module doc).
    """
    state = _rescope(state, token_fingerprint)
    state = _prune(state, now_ms, policy)
    if any(e == event_id for e, _ in state.seen):
        return state, []
    state = replace(state, seen=tuple(sorted((*state.seen, (event_id, now_ms)))))
    send = Send(
        kind="badge" if kind == "badge" else "alert",
        event_id=event_id,
        conversation_id=conversation_id,
        collapse_id=collapse_id(conversation_id) if conversation_id else "",
        merged_count=1,
        mailbox_seq=mailbox_seq,
        total_unread=total_unread,
        total_mention=total_mention,
        muted_unread=muted_unread,
        badge_projection_mailbox_seq=badge_projection_mailbox_seq,
    )
    if state.quiet is not None and badge_projection_mailbox_seq >= (
        state.quiet.badge_projection_mailbox_seq
    ):
        state = replace(state, quiet=_numbers(state.quiet, send))
    if send.kind == "badge":
        return state, [send]
    breaks = policy.quiet_hours_mentions_break_through and mention_type in _QUIET_BREAK_THROUGH
    until = None if breaks else quiet_until(policy.push_quiet_hours, timezone, now_ms)
    if until is not None:
        held = state.quiet or _numbers(Window(ends_at=until), send)  # newer numbers: above
        quiet = replace(held, ends_at=until, pending=held.pending + 1)
        return replace(state, quiet=quiet), [replace(send, kind="badge", reason="quiet_hours")]
    windows = dict(state.windows)
    open_window = windows.get(conversation_id)
    if open_window is not None and now_ms < open_window.ends_at:
        windows[conversation_id] = replace(
            open_window,
            pending=open_window.pending + 1,
            last_event_id=event_id,
            last_mailbox_seq=mailbox_seq,
            total_unread=total_unread,
            total_mention=total_mention,
            muted_unread=muted_unread,
            badge_projection_mailbox_seq=badge_projection_mailbox_seq,
        )
        return replace(state, windows=tuple(sorted(windows.items()))), []
    windows[conversation_id] = Window(ends_at=now_ms + policy.push_merge_window)
    state = replace(state, windows=tuple(sorted(windows.items())))
    state, send = _alert_or_badge(state, send, now_ms, policy)
    return state, [send]


def _numbers(window: Window, send: Send) -> Window:
    return replace(
        window,
        last_event_id=send.event_id,
        last_mailbox_seq=send.mailbox_seq,
        total_unread=send.total_unread,
        total_mention=send.total_mention,
        muted_unread=send.muted_unread,
        badge_projection_mailbox_seq=send.badge_projection_mailbox_seq,
    )


def next_flush_at(state: DeviceState) -> int | None:
    """When the earliest window that holds something back ends, or the quiet hours that
    quieted an alert end (None: nothing pending)."""
    ends = [w.ends_at for _, w in state.windows if w.pending]
    if state.quiet is not None:
        ends.append(state.quiet.ends_at)
    return min(ends) if ends else None


def flush_due(
    state: DeviceState, *, now_ms: int, policy: PushPolicy
) -> tuple[DeviceState, list[Send]]:
    """Close every window that ended: one merged "N new messages" alert per window that held
    messages back (rate limits apply to it too), and forget empty ended windows. Quiet hours
    that ended: ONE silent badge update with the latest numbers, never the backlog (16.4)."""
    state = _prune(state, now_ms, policy)
    sends: list[Send] = []
    quiet = state.quiet
    if quiet is not None and now_ms >= quiet.ends_at:
        sends.append(
            Send(
                kind="badge",
                event_id=f"quiet:{quiet.ends_at}:{quiet.badge_projection_mailbox_seq}",
                conversation_id="",
                collapse_id="",
                merged_count=quiet.pending,
                mailbox_seq=quiet.last_mailbox_seq,
                total_unread=quiet.total_unread,
                total_mention=quiet.total_mention,
                muted_unread=quiet.muted_unread,
                badge_projection_mailbox_seq=quiet.badge_projection_mailbox_seq,
                reason="quiet_hours_end",
            )
        )
        state = replace(state, quiet=None)
    windows: dict[str, Window] = {}
    for conversation_id, window in state.windows:
        if now_ms < window.ends_at:
            windows[conversation_id] = window
            continue
        if not window.pending:
            continue
        merged = Send(
            kind="alert",
            event_id=f"{window.last_event_id}#merged",
            conversation_id=conversation_id,
            collapse_id=collapse_id(conversation_id),
            merged_count=window.pending,
            mailbox_seq=window.last_mailbox_seq,
            total_unread=window.total_unread,
            total_mention=window.total_mention,
            muted_unread=window.muted_unread,
            badge_projection_mailbox_seq=window.badge_projection_mailbox_seq,
        )
        state, merged = _alert_or_badge(state, merged, now_ms, policy)
        sends.append(merged)
    return replace(state, windows=tuple(sorted(windows.items()))), sends


def retry_delay_ms(attempt: int) -> int:
    """Wait before retry number ``attempt`` (1-based): 1 s, 4 s, 16 s (16.5)."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if attempt <= len(RETRY_BACKOFF_MS):
        return RETRY_BACKOFF_MS[attempt - 1]
    return int(RETRY_BACKOFF_MS[-1] * 4 ** (attempt - len(RETRY_BACKOFF_MS)))


_APNS_DELETE: Final = frozenset({"BadDeviceToken", "Unregistered", "DeviceTokenNotForTopic"})
_FCM_DELETE: Final = frozenset({"UNREGISTERED", "INVALID_ARGUMENT"})


def classify(provider: str, status: int | None, reason: str) -> Outcome:
    """A provider's answer -> what to do (16.5, 16.6). ``status=None`` is a timeout or a
    connection failure: retried like a 5xx. Tokens are deleted only on the provider's own
    "this token is dead" answers, never on 5xx (upstream jitter must not mass-delete)."""
    if status is None or 500 <= status <= 599:
        return "retry"
    if 200 <= status <= 299:
        return "delivered"
    if provider == "APNS" and (status == 410 or reason in _APNS_DELETE):
        return "delete_token"
    if provider == "FCM" and (status == 404 or reason in _FCM_DELETE):
        return "delete_token"
    return "failed"


def pd1_push(
    *,
    has_token: bool,
    online: bool,
    pushed_at: int | None,
    applied_seq: int,
    entry_seq: int,
    materialized_at: int,
    now_ms: int,
    grace_ms: int,
    extended_ms: int,
) -> Literal["push", "wait", "skip"]:
    """16.1 / PD-1 for ONE device of the user, never the user as a whole.

    No registered token -> skip (it syncs on its next connection). Applied the entry -> skip.
    Offline -> push now (the entry is materialized: the caller only asks afterwards). Online:
    wait ``push_grace_window`` for PUSHED/APPLIED evidence; PUSHED without APPLIED extends to
    ``push_confirm_extended_window``; past the window without APPLIED -> push.
    """
    if not has_token or applied_seq >= entry_seq:
        return "skip"
    if not online:
        return "push"
    window = extended_ms if pushed_at is not None else grace_ms
    return "push" if now_ms - materialized_at >= window else "wait"
