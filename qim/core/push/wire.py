"""PUSH_EVENTS bodies spliced from shared map pairs: the ConnectionNode's "encode once" (10.3).

Why splice bytes instead of building a PushEvents struct per socket: 11.1.1 step 3 has every
recipient's event *reference* ``batch.common_encoded_body`` -- zero copy, no re-serialising --
and 10.3 says the ConnectionNode encodes the shared part once and builds only a light
personal part per socket. A SyncEntry is a msgpack map, and a map is a count plus key/value
pairs in any order, so an event is ``map_header(n1 + n2) || common pairs || personal pairs``:

* the *common* :class:`EntryFragment` (message coordinates + the A.4.1 body part) is built
  once per batch and the same object is shared by every connection of that batch;
* the *personal* fragment (mailbox_seq, event_ordinal, event_id, flags, ...) is a small
  encode per recipient.

The two field sets are disjoint by construction, so the spliced map decodes to exactly the
SyncEntry a struct-built encoding would give (a test checks it). A queued event keeps the two
fragments apart (9.4.2: the realtime queue holds a body *pointer*, never a copy per
connection); the bytes are joined only when the frame goes to the socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.push import FramePriority, PushBatch, PushRecipient

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "EntryFragment",
    "PendingPush",
    "common_fragment",
    "personal_fragment",
]

ENTRY_OVERHEAD_BYTES: Final = 64
"""Fixed ledger charge per queued event on top of its bytes (9.4.2 "each entry counts a fixed
overhead"): the Python objects behind a queued event. Our estimate, not a spec number."""

_ENCODER: Final = msgspec.msgpack.Encoder()
_EVENTS_KEY: Final = _ENCODER.encode("events")
_LAST_PUSHED_KEY: Final = _ENCODER.encode("last_pushed_user_seq")


def _map_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x80 | count,))
    if count < 1 << 16:
        return b"\xde" + count.to_bytes(2, "big")
    return b"\xdf" + count.to_bytes(4, "big")


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class EntryFragment:
    """Some key/value pairs of a msgpack map, without the map header."""

    pairs: bytes
    count: int

    @classmethod
    def of_map(cls, encoded: bytes) -> EntryFragment:
        """Strip the header of an encoded msgpack map (fixmap, map16 or map32)."""
        if not encoded:
            return cls(b"", 0)
        first = encoded[0]
        if 0x80 <= first <= 0x8F:
            return cls(encoded[1:], first & 0x0F)
        if first == 0xDE:
            return cls(encoded[3:], int.from_bytes(encoded[1:3], "big"))
        if first == 0xDF:
            return cls(encoded[5:], int.from_bytes(encoded[1:5], "big"))
        raise ValueError(f"not a msgpack map (first byte 0x{first:02X})")

    def __add__(self, other: EntryFragment) -> EntryFragment:
        return EntryFragment(self.pairs + other.pairs, self.count + other.count)


def common_fragment(batch: PushBatch) -> EntryFragment:
    """The pairs every recipient of ``batch`` shares: message coordinates + the body part.

    Built once per batch; ``common_encoded_body`` is referenced, never decoded.
    """
    coordinates = SyncEntry(
        message_id=batch.message_id,
        conversation_id=batch.conversation_id,
        conversation_seq=batch.conversation_seq,
        last_activity_id=batch.last_activity_id,
        sender_id=batch.sender_id,
        created_at=batch.created_at,
        target_message_id=batch.target_message_id,
        target_conversation_seq=batch.target_conversation_seq,
        body_included=batch.body_included,
    )
    fragment = EntryFragment.of_map(_ENCODER.encode(coordinates))
    if batch.body_included:
        fragment = fragment + EntryFragment.of_map(batch.common_encoded_body)
    return fragment


def personal_fragment(recipient: PushRecipient) -> EntryFragment:
    """The pairs that differ per recipient; ``event_type`` is ``event_ordinal`` (6.7, 11.1.1)."""
    entry = SyncEntry(
        mailbox_seq=recipient.mailbox_seq,
        event_ordinal=recipient.event_ordinal,
        event_id=recipient.event_id,
        event_type=recipient.event_ordinal,
        visibility_floor_conversation_seq=recipient.visibility_floor_conversation_seq,
        flags=recipient.flags,
        mention_type=recipient.mention_type,
        client_message_id=recipient.client_message_id,
        origin_device_id=recipient.origin_device_id,
        target_sender_id=recipient.target_sender_id,
        target_flags=recipient.target_flags,
        target_mention_type=recipient.target_mention_type,
    )
    return EntryFragment.of_map(_ENCODER.encode(entry))


@dataclass(frozen=True, slots=True)
class PendingPush:
    """One message's events for one connection, not yet written (one PUSH_EVENTS frame).

    ``common`` is the batch's shared fragment (the same object for every connection);
    ``events`` are this device's personal fragments, ascending by (event_ordinal, event_id).
    All events of one message share ``mailbox_seq`` (one dispatch record = one event group).
    """

    mailbox_seq: int
    common: EntryFragment
    events: tuple[EntryFragment, ...]
    priority: FramePriority = "direct"

    @property
    def ledger_bytes(self) -> int:
        """What this item costs the connection's one ledger (9.4.2, 11.3): the body once."""
        return len(self.common.pairs) + sum(
            len(e.pairs) + ENTRY_OVERHEAD_BYTES for e in self.events
        )

    def body(self, last_pushed_user_seq: int) -> bytes:
        """The PUSH_EVENTS body: ``{events: [...], last_pushed_user_seq}`` as msgpack."""
        parts = [b"\x82", _EVENTS_KEY, _array_header(len(self.events))]
        for event in self.events:
            parts += (_map_header(self.common.count + event.count), self.common.pairs, event.pairs)
        parts += (_LAST_PUSHED_KEY, _ENCODER.encode(last_pushed_user_seq))
        return b"".join(parts)
