"""The SDK applies unknown custom types by their flags and anchors, never failing a batch
(spec 13.3 hard requirement, 27.1.2).

One MAILBOX_BATCH mixes a known text message, custom types this build has never heard of (one
per anchor mode), a newer schema of a known type, an undecodable payload, an update of a row
the device does not hold, an unknown ``event_type`` and a MENTION entry. The cursor must reach
``covered_through_seq``, unread and ordering must follow the flags, rows the anchors.
"""

from __future__ import annotations

from qim.client import Timeline, anchor_of
from qim.client.sync import MailboxSync
from qim.schemas.frames import AuthOk, MailboxBatch, SyncEntry
from qim.schemas.frames.base import EntryFlags, EventType

NOW = 1_790_000_000_000
ME, PEER, CONV = "me", "peer", "g:shop"
COUNTS, MOVES, SHOWN = (
    EntryFlags.COUNTS_UNREAD,
    EntryFlags.AFFECTS_SESSION_ORDER,
    (EntryFlags.TIMELINE_VISIBLE),
)


def entry(
    mailbox_seq: int,
    seq: int,
    flags: int,
    *,
    custom_type: str | None = None,
    schema_version: int | None = None,
    target: int | None = None,
    event_type: int = EventType.MESSAGE,
    payload: bytes = b"hi",
    conversation_id: str = CONV,
) -> SyncEntry:
    return SyncEntry(
        mailbox_seq=mailbox_seq,
        event_id=mailbox_seq * 10,
        event_ordinal=event_type,
        event_type=event_type,
        message_id=mailbox_seq.to_bytes(16, "big"),
        conversation_id=conversation_id,
        conversation_seq=seq,
        last_activity_id=(1000 + seq).to_bytes(16, "big"),
        sender_id=PEER,
        flags=int(flags),
        created_at=NOW,
        target_conversation_seq=target,
        body_included=True,
        message_type=8 if custom_type else 0,
        custom_type=custom_type,
        schema_version=schema_version,
        payload_or_ciphertext=payload,
    )


BATCH = (
    entry(101, 1, COUNTS | MOVES | SHOWN),  # text: a row, unread, moves
    entry(102, 2, SHOWN, custom_type="acme.poll.v9"),  # unknown, shown, silent
    entry(103, 3, COUNTS, custom_type="acme.sync", payload=b"\xc1\xff"),  # unknown, no row
    entry(104, 4, 0, custom_type="acme.status", target=1),  # unknown update of row 1
    entry(105, 5, 0, custom_type="acme.status", target=99),  # update of a row never held
    entry(106, 6, MOVES | SHOWN, custom_type="card", schema_version=7),  # newer schema
    entry(107, 7, COUNTS | MOVES | SHOWN, event_type=42),  # an event type from the future
    entry(108, 1, 0, event_type=EventType.MENTION),  # mention: counted on its primary entry
    entry(109, 1, COUNTS | MOVES | SHOWN, conversation_id="d:other"),
)


def synced(batch: tuple[SyncEntry, ...]) -> tuple[MailboxSync, list[SyncEntry]]:
    sync = MailboxSync()
    sync.auth_cursor()
    (pull,) = sync.on_auth_ok(AuthOk(sync_to_seq=200, has_offline=True))
    delivered = sync.on_batch(pull, MailboxBatch(entries=batch, covered_through_seq=200), NOW)
    return sync, delivered


def test_a_batch_of_unknown_custom_types_applies_and_the_cursor_reaches_its_end() -> None:
    sync, delivered = synced(BATCH)
    timeline = Timeline(ME, known_custom_types={"card": 2})
    assert timeline.apply(delivered) == len(BATCH)
    assert sync.cursor.last_applied_mailbox_seq == 200  # never stuck on a type it can't read
    shop = timeline.conversations[CONV]
    # unread: the text (1) and the invisible acme.sync (3); not the future event type
    assert shop.unread == 2
    # order: the newest entry with AFFECTS_SESSION_ORDER is the newer-schema card (6)
    assert shop.last_activity_id == 1006
    # rows: own_seq only; acme.sync (none) has none, the status updates anchor on row 1
    assert sorted(shop.rows) == [1, 2, 6]
    assert [u.custom_type for u in shop.rows[1].updates] == ["acme.status"]
    assert timeline.orphan_updates_ignored == 1  # no orphan row for seq 99
    assert [shop.rows[s].placeholder for s in (1, 2, 6)] == [False, True, True]
    assert timeline.unknown_event_skipped == 1
    assert timeline.order() == [CONV, "d:other"]  # 1006 before 1001


def test_the_anchor_is_read_from_the_entry_alone() -> None:
    assert anchor_of(entry(1, 1, SHOWN)) == "own_seq"
    assert anchor_of(entry(1, 1, COUNTS)) == "none"
    assert anchor_of(entry(1, 2, SHOWN, target=1)) == "anchor_target"


def test_a_redelivered_entry_changes_nothing_and_read_clears_the_local_count() -> None:
    _, delivered = synced(BATCH)
    timeline = Timeline(ME)
    timeline.apply(delivered)
    assert timeline.apply(delivered) == 0  # a push of something already pulled
    assert timeline.conversations[CONV].unread == 2
    timeline.mark_read(CONV, 6)
    later = entry(110, 8, COUNTS | MOVES | SHOWN)
    old = entry(111, 3, COUNTS, custom_type="acme.sync")  # at or below the read position
    timeline.apply([later, old])
    assert timeline.conversations[CONV].unread == 1


def test_own_entries_never_count() -> None:
    mine = SyncEntry(
        mailbox_seq=1,
        conversation_id=CONV,
        conversation_seq=1,
        sender_id=ME,
        flags=int(COUNTS | MOVES | SHOWN),
    )
    timeline = Timeline(ME)
    timeline.apply([mine])
    assert timeline.conversations[CONV].unread == 0
