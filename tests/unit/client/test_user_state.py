"""The SDK's conversation-state calls: the CONVERSATION_STATE body each sends, and the local
list applied at once (the server never echoes the CONTROL entry to the asking device)."""

from __future__ import annotations

import pytest

from qim.client import QimClient
from qim.client.sessions import SessionList
from qim.client.user_state import UserStateCalls
from qim.schemas.frames import Body, ConversationState
from qim.schemas.frames.history import SessionEntry

CONV = "g:crew"


class Recorder(UserStateCalls):
    def __init__(self) -> None:
        self.sessions = SessionList()
        self.sessions.rows[CONV] = SessionEntry(
            conversation_id=CONV, preview_or_placeholder=b"hi", unread_count=0, unread_exact=True
        )
        self.sent: list[Body] = []

    async def send(self, body: Body, *, stream_id: int | None = None) -> None:
        self.sent.append(body)


async def test_each_call_sends_its_frame_and_applies_locally() -> None:
    c = Recorder()
    await c.pin(CONV, 3)
    assert c.sessions.rows[CONV].pin_rank == 3
    await c.unpin(CONV)
    assert c.sessions.rows[CONV].pin_rank is None
    await c.mute(CONV)
    await c.archive(CONV)
    assert c.sessions.rows[CONV].muted and c.sessions.rows[CONV].archived
    await c.mark_unread(CONV)
    row = c.sessions.rows[CONV]
    assert (row.unread_count, row.unread_exact) == (1, False)
    await c.clear_history(CONV)
    row = c.sessions.rows[CONV]
    assert (row.unread_count, row.unread_exact, row.preview_or_placeholder) == (0, True, b"")
    await c.set_notification_policy(CONV, "MENTION_ONLY")
    await c.mute(CONV, muted=False)
    await c.delete_conversation(CONV)
    assert CONV not in c.sessions.rows
    assert c.sent == [
        ConversationState(conversation_id=CONV, action="pin", pin_rank=3),
        ConversationState(conversation_id=CONV, action="pin"),
        ConversationState(conversation_id=CONV, action="mute", flag=True),
        ConversationState(conversation_id=CONV, action="archive", flag=True),
        ConversationState(conversation_id=CONV, action="mark_unread"),
        ConversationState(conversation_id=CONV, action="clear_history"),
        ConversationState(
            conversation_id=CONV, action="notification_policy", notification_policy="MENTION_ONLY"
        ),
        ConversationState(conversation_id=CONV, action="mute"),
        ConversationState(conversation_id=CONV, action="delete"),
    ]


async def test_an_unknown_policy_is_refused_before_sending() -> None:
    c = Recorder()
    with pytest.raises(ValueError, match="notification policy"):
        await c.set_notification_policy(CONV, "LOUD")
    assert c.sent == []


def test_the_client_has_the_calls() -> None:
    assert issubclass(QimClient, UserStateCalls)
    assert QimClient.send is not UserStateCalls.send  # the real one, request_id 0
