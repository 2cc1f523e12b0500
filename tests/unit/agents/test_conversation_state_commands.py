"""``command_of`` for every CONVERSATION_STATE action, as the gateway forwards it.

Each request becomes the ``UserStateCommand`` the MailboxNode appends to the shard log, and
that command asks the fold (``change_of``) for the 7.5 change 12.9 names. Requests that travel
with request_id 0 (every MARK_READ and CONVERSATION_STATE from the SDK) still get one
``command_id`` each: the user-requests offset is part of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from qim.agents.mailbox.sessions import SessionSnapshots, command_of, user_state_commands
from qim.core.mailbox import commit, materialize
from qim.core.mailbox.user_state import change_of
from qim.core.session_list import (
    ClearHistory,
    DeleteLocal,
    MarkUnread,
    SetArchived,
    SetMuted,
    SetNotificationPolicy,
    SetPin,
    UserChange,
)
from qim.gateway.conversation_state import state_fields
from qim.schemas.frames import ConversationState, Error
from qim.schemas.frames.history import PullSessionList
from qim.schemas.records.user_requests import UserStateRequest, encode_user_record
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.agents.test_mailbox_sessions import ME as LIST_ME
from tests.unit.agents.test_mailbox_sessions import PEER, _pull, _store
from tests.unit.mailbox.support import CONFIG, EPOCH, T, dispatch
from tests.unit.mailbox.support import SHARD as LIST_SHARD

SHARD, HEAD, CONV = 3, 41, "g:crew"


def forwarded(body: ConversationState, rid: int = 0) -> UserStateRequest:
    """The request the gateway builds (``session_requests.conversation_state``)."""
    fields = state_fields(body)
    assert not isinstance(fields, str), fields
    return UserStateRequest(
        tenant_id="t",
        user_id="ann",
        device_id="phone",
        session_epoch=9,
        connection_shard=1,
        request_id=rid,
        **fields,
    )


def made(request: UserStateRequest, offset: int | None = None) -> UserStateCommand:
    command = command_of(request, SHARD, 1234, offset=offset)
    assert command is not None
    return command


CASES: list[tuple[ConversationState, UserChange]] = [
    (ConversationState(conversation_id=CONV, action="mark_unread"), MarkUnread(HEAD)),
    (ConversationState(conversation_id=CONV, action="clear_history"), ClearHistory(HEAD)),
    (ConversationState(conversation_id=CONV, action="delete"), DeleteLocal(HEAD)),
    (ConversationState(conversation_id=CONV, action="pin", pin_rank=-2), SetPin(-2)),
    (ConversationState(conversation_id=CONV, action="pin"), SetPin(None)),
    (ConversationState(conversation_id=CONV, action="mute", flag=True), SetMuted(True)),
    (ConversationState(conversation_id=CONV, action="mute"), SetMuted(False)),
    (ConversationState(conversation_id=CONV, action="archive", flag=True), SetArchived(True)),
    (ConversationState(conversation_id=CONV, action="archive"), SetArchived(False)),
    (
        ConversationState(
            conversation_id=CONV, action="notification_policy", notification_policy="NONE"
        ),
        SetNotificationPolicy("NONE"),
    ),
]


@pytest.mark.parametrize(("body", "change"), CASES, ids=lambda v: getattr(v, "action", ""))
def test_each_action_becomes_the_command_the_fold_applies(
    body: ConversationState, change: UserChange
) -> None:
    command = made(forwarded(body, rid=5))
    assert (command.tenant_id, command.user_id, command.origin_device_id) == ("t", "ann", "phone")
    assert (command.conversation_id, command.action) == (CONV, body.action)
    assert (command.target_mailbox_shard, command.partition, command.committed_at) == (
        SHARD,
        SHARD,
        1234,
    )
    assert command.read_conversation_seq == 0
    assert change_of(command, HEAD) == change


def test_mark_unread_of_an_empty_conversation_changes_nothing() -> None:
    command = made(forwarded(ConversationState(conversation_id=CONV, action="mark_unread")))
    assert change_of(command, 0) is None


def test_the_offset_separates_requests_that_share_request_id_zero() -> None:
    pin = forwarded(ConversationState(conversation_id=CONV, action="pin", pin_rank=1))
    mute = forwarded(ConversationState(conversation_id=CONV, action="mute", flag=True))
    assert made(pin).command_id == made(mute).command_id  # why the offset is needed
    assert made(pin, offset=7).command_id != made(mute, offset=8).command_id
    assert made(pin, offset=7).command_id == made(pin, offset=7).command_id  # redelivery


@dataclass
class _Record:
    value: bytes
    offset: int


def test_a_fetched_run_keeps_every_state_change_in_order() -> None:
    bodies = [body for body, _ in CASES]
    records: list[Any] = [
        _Record(encode_user_record(forwarded(b)), 100 + n) for n, b in enumerate(bodies)
    ]
    commands = user_state_commands(records, SHARD, 1234)
    assert [c.action for c in commands] == [b.action for b in bodies]
    assert len({c.command_id for c in commands}) == len(bodies)


def test_clear_history_shows_an_empty_preview_until_the_next_message() -> None:
    """AT-42 on the PULL_SESSION_LIST path: listed, unread 0, empty placeholder; a new
    message brings its preview and unread back."""
    store, snaps = _store(3), SessionSnapshots()  # c0, c1, c2: one unread message each
    clear = UserStateRequest(
        tenant_id=T,
        user_id=LIST_ME,
        device_id="phone",
        session_epoch=1,
        connection_shard=0,
        conversation_id="c0",
        action="clear_history",
    )
    command = command_of(clear, LIST_SHARD, 5, offset=0)
    assert command is not None
    commit(store, materialize(store, [(3, command)], shard_epoch=EPOCH, config=CONFIG))
    shown = _pull(store, snaps, PullSessionList(limit=10), 0)
    assert not isinstance(shown, Error)
    rows = {e.conversation_id: e for e in shown.sessions}
    assert (rows["c0"].preview_or_placeholder, rows["c0"].unread_count) == (b"", 0)
    assert (rows["c1"].preview_or_placeholder, rows["c1"].unread_count) == (b"p1", 1)
    new = dispatch(
        5,
        conversation="c0",
        sender=PEER,
        participants=(LIST_ME, PEER),
        seq_in_conversation=2,
        payload=b"again",
    )
    commit(store, materialize(store, [(4, new)], shard_epoch=EPOCH, config=CONFIG))
    shown = _pull(store, snaps, PullSessionList(limit=10), 10)
    assert not isinstance(shown, Error)
    rows = {e.conversation_id: e for e in shown.sessions}
    assert (rows["c0"].preview_or_placeholder, rows["c0"].unread_count) == (b"again", 1)
