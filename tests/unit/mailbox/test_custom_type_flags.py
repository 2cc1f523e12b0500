"""Spec 13.3 downstream of the writer: a custom type's contract decides the entries, the
session list and the history, and every fold reads it from the log.

The chain is the production one, pure: ``ConversationWriterState`` (with the tenant's
declarations) -> ``message_dispatch`` (fanout) -> ``materialize`` (MailboxNode, with the
session fold) and ``archive_batch`` + ``pull_history`` (HistoryArchiver). A rebuilt projection
(``rebuild_user``, what ``qim replay projections`` compares) and a replayed store equal the
live ones, though no fold is ever given the declarations.
"""

from __future__ import annotations

import msgspec

from qim.core.conversation import direct_conversation_id
from qim.core.fanout.build import message_dispatch
from qim.core.history.archiver import archive_batch, write_all
from qim.core.history.paging import FULL_INTERVAL, HistoryBounds, pull_history
from qim.core.history.store import MemoryOrderedStore
from qim.core.mailbox import MemoryMailboxStore, StoreMailboxReader, store_digest
from qim.core.mailbox.session_store import load_projection, preview_of
from qim.core.mailbox.sessions import rebuild_user
from qim.schemas.frames import SyncEntry
from qim.schemas.frames.base import EntryFlags
from qim.schemas.frames.history import PullHistory
from qim.schemas.message_types import MessageType
from qim.schemas.records import SendRequest
from qim.schemas.records.outbox import MessageCommitted, PreviewPlaceholder
from tests.unit.conversation.support import (
    NOW,
    accepted,
    commit,
    contract,
    send_request,
    typed_config,
    writer,
)
from tests.unit.mailbox.support import CONFIG, SHARD, T, local_users, numbered, run

ME, PEER = local_users(2, "c")
CONV = direct_conversation_id(T, PEER, ME)

SILENT = contract("state.sync", counts_unread=False, affects_session_order=False)
HIDDEN = contract("call.missed", timeline_visible=False, anchor_mode="none")  # counts, moves
STATUS = contract(
    "order.status", anchor_mode="anchor_target", counts_unread=False, affects_session_order=False
)


def _send(n: int, custom_type: str = "", reply_to: int | None = None) -> SendRequest:
    return send_request(
        PEER,
        CONV,
        f"cm-{n}",
        tenant=T,
        peer=ME,
        payload=f"\xff{n}".encode("latin-1"),
        message_type=MessageType.CUSTOM if custom_type else MessageType.TEXT,
        custom_type=custom_type,
        reply_to=reply_to,
    )


def _committed() -> list[MessageCommitted]:
    """text(1), state.sync(2), call.missed(3), order.status on 1 (4), state.sync(5)."""
    state = writer(typed_config(SILENT, HIDDEN, STATUS, tenant=T))
    plan = [("", None), ("state.sync", None), ("call.missed", None), ("order.status", 1)]
    plan.append(("state.sync", None))
    out = []
    for n, (kind, target) in enumerate(plan, start=1):
        request = _send(n, kind, target)
        record = accepted(commit(state, request, NOW + n)).record
        assert isinstance(record, MessageCommitted)
        out.append(record)
    return out


def _materialized(
    records: list[MessageCommitted], *, one_by_one: bool = False
) -> MemoryMailboxStore:
    store = MemoryMailboxStore()
    log = numbered([message_dispatch(r, SHARD) for r in records])
    for batch in [[item] for item in log] if one_by_one else [log]:
        run(store, batch)
    return store


def _entries(store: MemoryMailboxStore, user: str) -> dict[int, SyncEntry]:
    reader = StoreMailboxReader(store, CONFIG.lane_count)
    return {e.conversation_seq: e for _, g in reader.read_user_range(T, user, 0, 2**62) for e in g}


def test_the_entries_carry_each_types_flags_and_anchor() -> None:
    records = _committed()
    mine = _entries(_materialized(records), ME)
    all_flags = int(
        EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER | EntryFlags.TIMELINE_VISIBLE
    )
    assert {seq: e.flags for seq, e in mine.items()} == {
        1: all_flags,
        2: int(EntryFlags.TIMELINE_VISIBLE),
        3: int(EntryFlags.COUNTS_UNREAD | EntryFlags.AFFECTS_SESSION_ORDER),
        4: int(EntryFlags.TIMELINE_VISIBLE),
        5: int(EntryFlags.TIMELINE_VISIBLE),
    }
    assert mine[4].target_conversation_seq == 1  # anchor_target: the row to update in place
    assert all(mine[s].target_conversation_seq is None for s in (1, 2, 3, 5))
    assert mine[2].custom_type == "state.sync" and mine[2].schema_version == 1
    # the sender's own entry never counts unread, whatever the type
    assert not any(
        e.flags & EntryFlags.COUNTS_UNREAD for e in _entries(_materialized(records), PEER).values()
    )


def test_unread_and_order_follow_the_contract_and_a_rebuild_agrees() -> None:
    records = _committed()
    store = _materialized(records)
    row = load_projection(store, T, ME).rows[CONV]
    # counted: text(1) and call.missed(3); state.sync / order.status count nothing
    assert row.unread_count == 2
    # moved by: text(1) and call.missed(3) only; the last two records do not move the session
    assert row.last_activity_id == int.from_bytes(records[2].last_activity_id, "big")
    badge = load_projection(store, T, ME).badge
    assert badge.sums[0] == 2
    rebuilt = rebuild_user(store, T, ME, CONFIG.session_list, CONFIG.lane_count)
    assert rebuilt.rows == load_projection(store, T, ME).rows
    assert rebuilt.badge.sums == badge.sums


def test_a_silent_type_leaves_unread_and_badge_exactly_as_they_were() -> None:
    records = _committed()
    before = _materialized(records[:1])
    after = _materialized([records[0], records[1]])
    one, two = load_projection(before, T, ME), load_projection(after, T, ME)
    assert two.rows[CONV].unread_count == one.rows[CONV].unread_count == 1
    assert two.badge.sums == one.badge.sums
    assert two.rows[CONV].last_activity_id == one.rows[CONV].last_activity_id


def test_a_custom_preview_is_its_template_never_its_payload() -> None:
    records = _committed()
    store = _materialized(records[:2])
    preview = preview_of(store, T, CONV, 2)
    shown = msgspec.msgpack.decode(preview, type=PreviewPlaceholder)
    assert (shown.custom_type, shown.template) == ("state.sync", "[state.sync]")
    assert records[1].payload not in preview


def test_replaying_the_dispatch_log_in_any_cut_gives_the_same_store_bytes() -> None:
    records = _committed()
    whole = _materialized(records)
    assert store_digest(whole.items()) == store_digest(
        _materialized(records, one_by_one=True).items()
    )


def test_timeline_invisible_types_stay_out_of_history() -> None:
    records = _committed()
    history = MemoryOrderedStore()
    write_all(history, archive_batch(records))
    page = pull_history(
        history,
        tenant_id=T,
        request=PullHistory(conversation_id=CONV, direction="newer"),
        interval=FULL_INTERVAL,
        bounds=HistoryBounds(latest_conversation_seq=5, earliest_available_conversation_seq=1),
    )
    assert [m.conversation_seq for m in page.messages] == [1, 2, 4, 5]  # not call.missed (3)
    assert not page.has_more
    assert {m.custom_type for m in page.messages} == {None, "state.sync", "order.status"}
    older = pull_history(
        history,
        tenant_id=T,
        request=PullHistory(
            conversation_id=CONV, direction="older", anchor_conversation_seq=4, limit=1
        ),
        interval=FULL_INTERVAL,
        bounds=HistoryBounds(latest_conversation_seq=5, earliest_available_conversation_seq=1),
    )
    assert [m.conversation_seq for m in older.messages] == [2]  # paging skips the hidden row
    assert older.has_more
