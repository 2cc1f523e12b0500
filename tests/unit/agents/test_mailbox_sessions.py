"""The MailboxNode's session-list shell: read merge window, request -> command, snapshots."""

from __future__ import annotations

from qim.agents.mailbox.sessions import (
    ReadMerge,
    SessionSnapshots,
    command_of,
    session_list_page,
)
from qim.core.mailbox import MemoryMailboxStore, commit, materialize
from qim.core.session_list import SessionListConfig
from qim.schemas.frames import Error
from qim.schemas.frames.history import PullSessionList, SessionListBatch
from qim.schemas.records.user_requests import PullSessionListRequest, UserStateRequest
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import CONFIG, EPOCH, SHARD, T, dispatch, local_users

ME, PEER = local_users(2, "w")
KEY = b"k" * 32


def request(action: str, conv: str, seq: int = 0, rid: int = 1) -> UserStateRequest:
    return UserStateRequest(
        tenant_id=T,
        user_id=ME,
        device_id="phone",
        session_epoch=1,
        connection_shard=0,
        request_id=rid,
        conversation_id=conv,
        action=action,
        read_conversation_seq=seq,
    )


def command(action: str, conv: str, seq: int = 0, rid: int = 1) -> UserStateCommand:
    made = command_of(request(action, conv, seq, rid), SHARD, 1000)
    assert made is not None
    return made


def test_reads_merge_per_conversation_and_other_commands_keep_the_order() -> None:
    merge = ReadMerge(window_ms=3000)
    assert merge.add([command("mark_read", "a", 5), command("mark_read", "a", 9, 2)], 0) == []
    assert merge.add([command("mark_read", "a", 7, 3), command("mark_read", "b", 1, 4)], 100) == []
    assert merge.due(2999) == []
    due = merge.due(3000)
    assert [(c.conversation_id, c.read_conversation_seq) for c in due] == [("a", 9)]
    merge.add([command("mark_read", "c", 2, 5)], 3100)
    out = merge.add([command("mark_unread", "c", rid=6)], 3200)  # releases ME's held reads first
    assert [(c.action, c.conversation_id) for c in out] == [
        ("mark_read", "b"),
        ("mark_read", "c"),
        ("mark_unread", "c"),
    ]
    assert merge.held == {}


def test_unknown_actions_are_dropped_and_ids_are_deterministic() -> None:
    assert command_of(request("teleport", "a"), SHARD, 0) is None
    assert command("pin", "a").command_id == command("pin", "a").command_id
    assert command("pin", "a").command_id != command("pin", "a", rid=2).command_id


def _store(messages: int) -> MemoryMailboxStore:
    store = MemoryMailboxStore()
    log = [
        (
            n,
            dispatch(
                n + 1,
                conversation=f"c{n % 3}",
                sender=PEER,
                participants=(ME, PEER),
                seq_in_conversation=n + 1,
                payload=f"p{n}".encode(),
            ),
        )
        for n in range(messages)
    ]
    commit(store, materialize(store, log, shard_epoch=EPOCH, config=CONFIG))
    return store


def _pull(
    store: MemoryMailboxStore, snaps: SessionSnapshots, msg: PullSessionList, now: int
) -> SessionListBatch | Error:
    req = PullSessionListRequest(
        tenant_id=T, user_id=ME, device_id="d", session_epoch=1, connection_shard=0, message=msg
    )
    return session_list_page(
        store, req, SessionListConfig(), cursor_key=KEY, snapshots=snaps, now_ms=now
    )


def test_pages_keep_their_snapshot_and_a_changed_reload_bumps_the_revision() -> None:
    store, snaps = _store(6), SessionSnapshots()
    first = _pull(store, snaps, PullSessionList(limit=2), 0)
    assert not isinstance(first, Error) and first.has_more and first.snapshot_revision == 1
    # the list changes (a new message) while paging: the next page is still revision 1's
    more = [(6, dispatch(7, conversation="c9", sender=PEER, participants=(ME, PEER)))]
    commit(store, materialize(store, more, shard_epoch=EPOCH, config=CONFIG))
    nxt = PullSessionList(snapshot_revision=1, page_cursor=first.next_page_cursor, limit=2)
    second = _pull(store, snaps, nxt, 10)
    assert not isinstance(second, Error) and second.snapshot_revision == 1
    seen = [s.conversation_id for s in (*first.sessions, *second.sessions)]
    assert seen == ["c2", "c1", "c0"]
    again = _pull(store, snaps, PullSessionList(limit=2), 20)  # page 1 again: reloaded
    assert not isinstance(again, Error) and again.snapshot_revision == 2
    assert again.sessions[0].conversation_id == "c9"
    forged = PullSessionList(snapshot_revision=2, page_cursor=b"x" * 80, limit=2)
    assert isinstance(_pull(store, snaps, forged, 30), Error)


def test_a_structural_change_restarts_paging_on_a_new_revision() -> None:
    store, snaps = _store(6), SessionSnapshots()
    first = _pull(store, snaps, PullSessionList(limit=2), 0)
    assert not isinstance(first, Error) and first.has_more
    snaps.invalidate(T, ME)  # e.g. a pin was folded
    nxt = PullSessionList(snapshot_revision=1, page_cursor=first.next_page_cursor, limit=2)
    restarted = _pull(store, snaps, nxt, 10)
    assert not isinstance(restarted, Error)
    assert restarted.snapshot_revision == 2
    assert restarted.sessions == first.sessions  # page 1 again, of the new revision
