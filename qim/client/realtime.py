"""Transient signals in the SDK (spec 13.2, 13.5): typing, with its local indicator state.

None of these touch the mailbox, so none of them has a cursor, a retry or a reply on success:
``typing()`` goes out and is either relayed to the conversation's other members or refused
(an ``ERROR`` carrying its request_id, e.g. PERMISSION_DENIED for a non-member, delivered as
an event and in ``last_error``).

Downlink handling: :class:`TypingIndicators` keeps who is typing where, each entry until its
``expires_in_ms`` runs out (there is no stop frame, 13.2); ``on_typing`` is called for each
downlink TYPING, before the frame is queued as an event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from qim.schemas.frames import Body
from qim.schemas.frames.control import Typing, TypingDown

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

    typing_indicators: TypingIndicators

    async def notify(self, body: Body) -> int:
        raise NotImplementedError

    async def typing(self, conversation_id: str) -> int:
        """TYPING (A.3 #10): "I am typing" to the other members' online devices; returns the
        request_id a refusal would carry. Call it again while typing: the server sends at most
        one per ``typing_merge_window`` and the indicator lasts ``typing_ttl`` (13.2)."""
        return await self.notify(Typing(conversation_id=conversation_id))

    def _realtime_frame(self, body: Body, now_ms: int) -> None:
        """Downlink transient frames update the local state before they are queued."""
        if isinstance(body, TypingDown):
            self.typing_indicators.on_frame(body, now_ms)
            if self.on_typing is not None:
                self.on_typing(body)
