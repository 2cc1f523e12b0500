"""The user's own conversation-state calls (spec 12.9) over CONVERSATION_STATE [ext] (0x0407).

Why fire and forget, like MARK_READ: the server sends no reply frame. The change is appended
to the user's shard log; the user's *other* devices learn it from the CONTROL entry in their
mailbox and from PULL_SESSION_LIST (pin and archive bump ``snapshot_revision``, 12.8.2). The
CONTROL entry is never echoed to the asking device (9.7), so each call also applies its effect
to this device's local list at once, as :meth:`~qim.client.calls.FrameCalls.mark_read` does.
A refused frame (malformed id, unknown policy) comes back as an ERROR event.
"""

from __future__ import annotations

from typing import Any

import msgspec

from qim.client.sessions import SessionList
from qim.schemas.frames import Body
from qim.schemas.frames.control import NOTIFICATION_POLICIES, ConversationState

__all__ = ["UserStateCalls"]


class UserStateCalls:
    """Mixin of :class:`~qim.client.QimClient`: mark unread, clear history, delete, pin,
    mute, archive and the notification policy of one conversation."""

    sessions: SessionList

    async def send(self, body: Body, *, stream_id: int | None = None) -> None:
        raise NotImplementedError

    async def mark_unread(self, conversation_id: str) -> None:
        """Mark unread: every device shows >= 1 unread with ``unread_exact`` false until a
        MARK_READ reaches the conversation's latest message (7.5)."""
        await self._state(conversation_id, "mark_unread")
        row = self.sessions.rows.get(conversation_id)
        if row is not None:
            self._local(conversation_id, unread_count=max(1, row.unread_count), unread_exact=False)

    async def clear_history(self, conversation_id: str) -> None:
        """Clear history (alias: hide): stays listed, unread 0, an empty preview (AT-42)."""
        await self._state(conversation_id, "clear_history")
        self._local(
            conversation_id,
            unread_count=0,
            unread_exact=True,
            mention_count=0,
            mention_first_conversation_seq=0,
            preview_or_placeholder=b"",
        )

    async def delete_conversation(self, conversation_id: str) -> None:
        """Delete (local): leaves the list until a new message brings it back."""
        await self._state(conversation_id, "delete")
        self.sessions.rows.pop(conversation_id, None)

    async def pin(self, conversation_id: str, pin_rank: int) -> None:
        """Pin at ``pin_rank`` (ascending: a smaller rank sorts first)."""
        await self._state(conversation_id, "pin", pin_rank=pin_rank)
        self._local(conversation_id, pin_rank=pin_rank)

    async def unpin(self, conversation_id: str) -> None:
        await self._state(conversation_id, "pin", pin_rank=None)
        self._local(conversation_id, pin_rank=None)

    async def mute(self, conversation_id: str, muted: bool = True) -> None:
        """Mute (or unmute): no alerts but mentions (16.2), unread still counted."""
        await self._state(conversation_id, "mute", flag=muted)
        self._local(conversation_id, muted=muted)

    async def archive(self, conversation_id: str, archived: bool = True) -> None:
        """Archive (or unarchive): moves to (or out of) the archived partition."""
        await self._state(conversation_id, "archive", flag=archived)
        self._local(conversation_id, archived=archived)

    async def set_notification_policy(self, conversation_id: str, policy: str) -> None:
        """``ALL``, ``MENTION_ONLY`` or ``NONE`` (16.2); ValueError for anything else."""
        if policy not in NOTIFICATION_POLICIES:
            raise ValueError(f"notification policy must be one of {NOTIFICATION_POLICIES}")
        await self._state(conversation_id, "notification_policy", notification_policy=policy)

    async def _state(self, conversation_id: str, action: str, **fields: Any) -> None:
        await self.send(ConversationState(conversation_id=conversation_id, action=action, **fields))

    def _local(self, conversation_id: str, **updates: Any) -> None:
        row = self.sessions.rows.get(conversation_id)
        if row is not None:
            self.sessions.rows[conversation_id] = msgspec.structs.replace(row, **updates)
