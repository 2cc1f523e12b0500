"""The mention_only tier on a MailboxShard (spec 10.2.3, 11.4.1, AT-39/40/42)."""

from __future__ import annotations

import msgspec

from qim.core.mailbox import MemoryMailboxStore, commit, materialize
from qim.core.mailbox.read_diffusion import ONLINE_ACTION, load_head
from qim.core.mailbox.reader import StoreMailboxReader
from qim.core.session_list.read_diffusion import TierHead, overlay_row
from qim.core.session_list.rows import SessionRow
from qim.core.session_list.state import UserConversationState
from qim.schemas.events import EventType
from qim.schemas.frames import SyncEntry
from qim.schemas.frames.base import MENTION_ALL, EntryFlags, MentionType
from qim.schemas.records.dispatch import (
    DispatchLogRecord,
    EventTemplate,
    GroupDispatch,
    ShardLogRecord,
)
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    T,
    dispatch,
    group_slice,
    local_users,
    numbered,
    run,
)

G = "g:big"


def _entries(store: MemoryMailboxStore, user: str) -> list[SyncEntry]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    return [e for _, group in reader.read_user_range(T, user, 0, 1 << 62) for e in group]


def _kinds(store: MemoryMailboxStore, user: str) -> list[tuple[int, int]]:
    return [(e.conversation_seq, e.event_type) for e in _entries(store, user)]


def _group_message(
    n: int, sender: str, mentions: tuple[str, ...] = (), policy: str = "mention_only"
) -> GroupDispatch:
    d = dispatch(
        n,
        conversation=G,
        kind="group",
        sender=sender,
        version=1,
        template=EventTemplate(mention_targets=mentions),
    )
    return msgspec.structs.replace(d, write_policy=policy)


def test_ao_39_silent_members_get_no_message_entry_a_mentioned_one_a_mention_entry() -> None:
    a, b, c, d = local_users(4)
    store = MemoryMailboxStore()
    slices = group_slice(G, 1, [(u, 0) for u in (a, b, c, d)])
    run(store, numbered([*slices, _group_message(1, a, mentions=(b,))]))
    assert _kinds(store, a) == [(1, EventType.MESSAGE)]  # the sender: active by its send
    [mention] = _entries(store, b)
    assert (mention.event_type, mention.mention_type) == (EventType.MENTION, MentionType.AT_ME)
    # the silent member's only entry stands in for the primary: it counts, it has no row
    assert mention.flags & EntryFlags.COUNTS_UNREAD
    assert not mention.flags & EntryFlags.TIMELINE_VISIBLE
    assert _entries(store, c) == [] and _entries(store, d) == []
    head = load_head(store, T, G)
    assert head is not None and head.write_policy == "mention_only"
    assert (head.latest_conversation_seq, head.switched_at_conversation_seq) == (1, 1)


def test_ao_42_a_send_makes_a_member_active_for_the_very_next_message() -> None:
    a, b, c = local_users(3)
    store = MemoryMailboxStore()
    slices = group_slice(G, 1, [(u, 0) for u in (a, b, c)])
    log: list[DispatchLogRecord] = [
        *slices,
        _group_message(1, a),
        _group_message(2, c),
        _group_message(3, a),
    ]
    run(store, numbered(log))
    assert _kinds(store, c) == [(2, EventType.MESSAGE), (3, EventType.MESSAGE)]
    assert _kinds(store, b) == []
    assert _kinds(store, a) == [(1, EventType.MESSAGE), (2, EventType.MESSAGE), (3, 0)]


def test_at_all_reaches_everyone_as_a_mention_entry_and_active_ones_keep_the_message() -> None:
    a, b, c = local_users(3)
    store = MemoryMailboxStore()
    slices = group_slice(G, 1, [(u, 0) for u in (a, b, c)])
    run(store, numbered([*slices, _group_message(1, a, mentions=(MENTION_ALL,))]))
    assert _kinds(store, a) == [(1, EventType.MESSAGE), (1, EventType.MENTION)]
    assert _kinds(store, b) == [(1, EventType.MENTION)]
    assert _kinds(store, c) == [(1, EventType.MENTION)]
    assert {e.mention_type for e in _entries(store, b)} == {MentionType.AT_ALL}


def test_always_is_untouched_and_a_return_to_always_is_recorded_on_the_head() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    slices = group_slice(G, 1, [(u, 0) for u in (a, b)])
    run(store, numbered([*slices, _group_message(1, a, policy="always")]))
    assert _kinds(store, b) == [(1, EventType.MESSAGE)]
    assert load_head(store, T, G) is None  # no head is kept for a conversation never switched
    run(store, numbered([_group_message(2, a), _group_message(3, a, policy="always")], start=2))
    assert _kinds(store, b) == [(1, EventType.MESSAGE), (3, EventType.MESSAGE)]
    head = load_head(store, T, G)
    assert head == TierHead(
        write_policy="always",
        latest_conversation_seq=3,
        last_activity_id=head.last_activity_id if head else b"",
        last_message_id=head.last_message_id if head else b"",
        switched_at_conversation_seq=3,
    )


def test_ao_40_the_session_row_joins_the_head_with_an_estimated_unread() -> None:
    head = TierHead(
        write_policy="mention_only",
        latest_conversation_seq=500,
        last_activity_id=(9000).to_bytes(16, "big"),
        last_message_id=(77).to_bytes(16, "big"),
        switched_at_conversation_seq=101,
    )
    state = UserConversationState(
        conversation_id=G, joined_at_conversation_seq=10, read_conversation_seq=100
    )
    row = SessionRow(conversation_id=G, latest_conversation_seq=100, last_activity_id=10)
    shown = overlay_row(row, state, head)
    assert (shown.latest_conversation_seq, shown.last_activity_id) == (500, 9000)
    assert shown.last_message_id == 77
    assert (shown.unread_count, shown.unread_exact) == (400, False)  # 500 - max(100, 10, 0)
    # no row yet (only silent-period messages): one is made from the head alone
    fresh = overlay_row(None, UserConversationState(conversation_id=G), head)
    assert (fresh.latest_conversation_seq, fresh.unread_count) == (500, 500)


def test_ao_42_a_login_record_makes_a_member_active_and_writes_nothing_itself() -> None:
    a, b, c = local_users(3)
    store = MemoryMailboxStore()
    slices = group_slice(G, 1, [(u, 0) for u in (a, b, c)])
    run(store, numbered([*slices, _group_message(1, a)]))
    online = UserStateCommand(
        tenant_id=T,
        user_id=b,
        conversation_id="",
        action=ONLINE_ACTION,
        command_id=bytes(16),
        target_mailbox_shard=0,
        committed_at=BASE_TIME + 1500,
    )
    log: list[tuple[int, ShardLogRecord]] = [
        (len(slices) + 1, online),
        (len(slices) + 2, _group_message(2, a)),
    ]
    commit(store, materialize(store, log, shard_epoch=EPOCH, config=CONFIG))
    assert _kinds(store, b) == [(2, EventType.MESSAGE)]  # nothing for the login, then entries
    assert _kinds(store, c) == []
