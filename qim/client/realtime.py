# ruff: noqa: ASYNC109  # timeout= is the reply deadline of one request (see client.py)
"""Transient signals in the SDK (spec 13.2, 13.5): typing, presence and RTC signalling.

None of these touch the mailbox, so none of them has a cursor, a retry or a reply on success:
``typing()`` goes out and is either relayed to the conversation's other members or refused
(an ``ERROR`` carrying its request_id, e.g. PERMISSION_DENIED for a non-member, delivered as
an event and in ``last_error``).

``subscribe_presence()`` returns the full snapshot of the (new) subscription set; later
changes arrive as PRESENCE_SUB frames with request_id 0. Subscriptions are soft state on the
server's connection: after a reconnect or a REDIRECT, subscribe again (13.2).

``rtc_signal()`` sends one RTC_SIGNAL step (invite, ringing, accept, reject, busy, cancel,
bye) of a call the app names by ``call_id``; the callee's devices all ring, the server sends
``cancel`` itself with ``reason`` ``answered_elsewhere`` / ``rejected_elsewhere`` (another
device of the callee answered), ``timeout`` (``rtc_ring_timeout`` passed) or ``offline`` (no
device of the target is online; answered with the request's request_id). The call record is
an ordinary message the app sends afterwards (13.5.3).

Downlink handling: :class:`TypingIndicators` keeps who is typing where, each entry until its
``expires_in_ms`` runs out (there is no stop frame, 13.2); :attr:`presence` holds the latest
entry per user from the snapshot and the increments. ``on_typing`` / ``on_presence`` are
called for each downlink frame, before it is queued as an event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from qim.schemas.frames import Body
from qim.schemas.frames.control import (
    PresenceEntry,
    PresenceSub,
    PresenceSubDown,
    Typing,
    TypingDown,
)
from qim.schemas.frames.rtc import RtcSignal, RtcSignalDown

__all__ = ["RealtimeCalls", "TypingIndicators"]


@dataclass
class TypingIndicators:
    """Who is typing, per conversation: ``(conversation_id, user_id) -> expires_at_ms``."""

    until: dict[tuple[str, str], int] = field(default_factory=dict)

    def on_frame(self, frame: TypingDown, now_ms: int) -> None:
        self.until[(frame.conversation_id, frame.user_id)] = now_ms + frame.expires_in_ms

    def typing(self, conversation_id: str, now_ms: int) -> tuple[str, ...]:
        """The users shown as typing in ``conversation_id`` at ``now_ms`` (sorted)."""
        for key in [k for k, t in self.until.items() if t <= now_ms]:
            del self.until[key]
        return tuple(sorted(u for (c, u) in self.until if c == conversation_id))


class RealtimeCalls:
    """Mixin of :class:`~qim.client.QimClient`: the transient frames and their handlers."""

    on_typing: Callable[[TypingDown], None] | None = None
    """Called for every downlink TYPING (after :attr:`typing_indicators` took it)."""

    on_presence: Callable[[PresenceSubDown], None] | None = None
    """Called for every incremental PRESENCE_SUB (after :attr:`presence` took it)."""

    on_rtc_signal: Callable[[RtcSignalDown], None] | None = None
    """Called for every downlink RTC_SIGNAL (relayed, or the server's own ``cancel``)."""

    typing_indicators: TypingIndicators
    presence: dict[str, PresenceEntry]
    """The latest presence entry per subscribed user (snapshot, then increments)."""

    async def notify(self, body: Body) -> int:
        raise NotImplementedError

    async def _call_presence(self, body: PresenceSub, timeout: float | None) -> PresenceSubDown:
        raise NotImplementedError

    async def subscribe_presence(
        self,
        user_ids: tuple[str, ...] = (),
        *,
        conversation_id: str = "",
        action: str = "subscribe",
        timeout: float | None = None,
    ) -> PresenceSubDown:
        """PRESENCE_SUB (A.3 #11): ``action`` subscribe | unsubscribe | replace, by
        ``user_ids`` OR a group ``conversation_id`` (its members), never both. Returns the
        full snapshot (empty for unsubscribe). Over ``presence_sub_max_targets`` the server
        answers RATE_LIMITED with ``retry_after_ms`` = ``RETRY_AFTER_NEVER_MS``: nothing was
        subscribed and retrying will not help (:class:`~qim.client.QimError`;
        :func:`~qim.client.retry_delay_ms` says None)."""
        body = PresenceSub(action=action, targets=tuple(user_ids), conversation_id=conversation_id)
        snapshot = await self._call_presence(body, timeout)
        if action == "unsubscribe":
            for user in user_ids:
                self.presence.pop(user, None)
        elif action == "replace":
            self.presence.clear()
        for entry in snapshot.entries:
            self.presence[entry.user_id] = entry
        return snapshot

    async def typing(self, conversation_id: str) -> int:
        """TYPING (A.3 #10): "I am typing" to the other members' online devices; returns the
        request_id a refusal would carry. Call it again while typing: the server sends at most
        one per ``typing_merge_window`` and the indicator lasts ``typing_ttl`` (13.2)."""
        return await self.notify(Typing(conversation_id=conversation_id))

    async def rtc_signal(
        self,
        conversation_id: str,
        target_user_id: str,
        signal_type: str,
        call_id: str,
        signal_payload: bytes = b"",
        *,
        reason: str = "",
    ) -> int:
        """RTC_SIGNAL (A.3 #16): one call step to every online device of ``target_user_id``
        (both must be members of ``conversation_id``); ``signal_payload`` (<= 8 KiB) is
        opaque to the server. Returns the request_id a refusal or ``offline`` would carry."""
        body = RtcSignal(
            conversation_id=conversation_id,
            target_user_id=target_user_id,
            signal_payload=signal_payload,
            call_id=call_id,
            signal_type=signal_type,
            reason=reason,
        )
        return await self.notify(body)

    def _realtime_frame(self, body: Body, now_ms: int) -> None:
        """Downlink transient frames update the local state before they are queued."""
        if isinstance(body, TypingDown):
            self.typing_indicators.on_frame(body, now_ms)
            if self.on_typing is not None:
                self.on_typing(body)
        elif isinstance(body, RtcSignalDown):
            if self.on_rtc_signal is not None:
                self.on_rtc_signal(body)
        elif isinstance(body, PresenceSubDown):
            for entry in body.entries:
                self.presence[entry.user_id] = entry
            if self.on_presence is not None:
                self.on_presence(body)
