"""The MailboxNode's push planner: one message's entries -> one PushBatch per ConnectionShard.

Where it sits (11.1.2, I-18, fixed order): the MailboxNode materializes the entries and
advances ``W[lane]`` first; only then does it call :func:`plan_push` with those entries. The
planner never sees an entry that is not durable, and its output is **fire-and-forget**: a
batch that is lost, dropped or refused changes nothing in the mailbox, whose entries the
client pulls back with PULL_MAILBOX (11.1.2, 11.2 "PUSHED is best effort"). Nothing here
returns a value the mailbox side could roll back on.

What it guarantees:

* exactly one PushBatch per ConnectionShard that has at least one live device (I-19, 26 #23),
  however many recipients it holds -- so a MailboxShard sends at most conn/mailbox shard
  batches per message (5.2);
* the body is encoded ONCE per message and the same ``bytes`` object is shared by every
  batch (10.3, I-19); ``encode`` is injectable so tests can count the calls;
* every live device of every recipient is addressed, the sender's other devices included;
  a CONTROL entry is not pushed back to its ``origin_device_id`` (7.3, 9.7.2) -- it stays in
  the mailbox, only the push is skipped. A MESSAGE is pushed to the sending device too: its
  entry carries ``client_message_id`` for the echo dedup of 7.3;
* deterministic output: recipients ascending by (user, device, mailbox_seq, event_ordinal,
  event_id), batches ascending by shard, whatever the input order (direction.md 4.7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from qim.core.push.presence_cache import ShardPresenceCache
from qim.schemas.frames.base import EventType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.outbox import ConversationKind
from qim.schemas.records.presence import PresenceEntry
from qim.schemas.records.push import (
    FramePriority,
    PushBatch,
    PushBody,
    PushRecipient,
    encode_push_body,
)

__all__ = [
    "LARGE_GROUP_MEMBER_THRESHOLD",
    "MaterializedEntry",
    "PushPlan",
    "plan_push",
    "push_body_of",
    "push_priority",
]

LARGE_GROUP_MEMBER_THRESHOLD: Final = 1000
"""B.6.1 ``large_group_member_threshold``: 1000 members is a small group, 1001 large (26 #35).
Not yet declared in ``qim.params``; pass the configured value where it is."""

_MESSAGE_FIELDS: Final = (
    "message_id",
    "conversation_id",
    "conversation_seq",
    "last_activity_id",
    "sender_id",
    "created_at",
    "target_message_id",
    "target_conversation_seq",
)


@dataclass(frozen=True, slots=True)
class MaterializedEntry:
    """One recipient's durable entry of the message: the 7.3 reference part, A.4.1 names."""

    user_id: str
    entry: SyncEntry


@dataclass(frozen=True, slots=True)
class PushPlan:
    """The batches to produce (fire-and-forget) and what was left out, for metrics and 16.1."""

    batches: tuple[PushBatch, ...]
    offline_users: tuple[str, ...]  # recipients with no live device: offline-push candidates
    skipped_origin: int  # CONTROL events not pushed back to their origin device

    @property
    def recipient_count(self) -> int:
        return sum(len(b.recipients) for b in self.batches)


def push_priority(
    kind: ConversationKind,
    member_count: int,
    *,
    large_group_member_threshold: int = LARGE_GROUP_MEMBER_THRESHOLD,
) -> FramePriority:
    """11.3.2: 1:1 > small group > large group; ``member_count`` of the pinned version."""
    if kind == "direct":
        return "direct"
    return "large_group" if member_count > large_group_member_threshold else "small_group"


def push_body_of(dispatch: GroupDispatch) -> PushBody:
    """The body part a GroupDispatch carries (direction.md 4.4: it always rides along).

    The caller passes None to :func:`plan_push` instead when the body may not be shown
    (governance removal, retention, over ``max_frame_bytes``: A.4.1 ``body_included=false``).
    """
    return PushBody(
        message_type=dispatch.message_type,
        custom_type=dispatch.custom_type or None,
        schema_version=dispatch.schema_version or None,
        payload_or_ciphertext=dispatch.payload,
    )


def plan_push(
    entries: Sequence[MaterializedEntry],
    *,
    tenant_id: str,
    mailbox_shard: int,
    presence: ShardPresenceCache,
    now_ms: int,
    body: PushBody | None,
    priority: FramePriority = "direct",
    encode: Callable[[PushBody], bytes] = encode_push_body,
) -> PushPlan:
    """Plan the PushBatches of one message from its materialized entries (module doc)."""
    if not entries:
        return PushPlan((), (), 0)
    first = entries[0].entry
    for item in entries:
        if any(getattr(item.entry, f) != getattr(first, f) for f in _MESSAGE_FIELDS):
            raise ValueError("plan_push takes the entries of exactly one message")
    by_user: dict[str, list[SyncEntry]] = {}
    for item in entries:
        by_user.setdefault(item.user_id, []).append(item.entry)

    rows: dict[int, list[PushRecipient]] = {}
    offline: list[str] = []
    skipped = 0
    for user_id in sorted(by_user):
        devices = (
            presence.devices(tenant_id, user_id, now_ms)
            if presence.online.is_online(tenant_id, user_id)
            else ()
        )
        if not devices:
            offline.append(user_id)
            continue
        group = sorted(by_user[user_id], key=lambda e: (e.mailbox_seq, e.event_ordinal, e.event_id))
        for device in devices:
            for entry in group:
                if _is_own_control_echo(entry, device):
                    skipped += 1
                    continue
                header = _recipient(user_id, device, entry, own=user_id == first.sender_id)
                rows.setdefault(device.connection_shard, []).append(header)

    shared = encode(body) if body is not None and rows else b""
    batches = tuple(
        PushBatch(
            tenant_id=tenant_id,
            connection_shard=shard,
            mailbox_shard=mailbox_shard,
            message_id=first.message_id,
            conversation_id=first.conversation_id,
            conversation_seq=first.conversation_seq,
            last_activity_id=first.last_activity_id,
            sender_id=first.sender_id,
            created_at=first.created_at,
            priority=priority,
            target_message_id=first.target_message_id,
            target_conversation_seq=first.target_conversation_seq,
            body_included=body is not None,
            common_encoded_body=shared,
            recipients=tuple(rows[shard]),
        )
        for shard in sorted(rows)
    )
    return PushPlan(batches, tuple(offline), skipped)


def _is_own_control_echo(entry: SyncEntry, device: PresenceEntry) -> bool:
    """9.7.2 layer 2: a CONTROL event is not pushed to the device it came from."""
    return entry.event_type == EventType.CONTROL and entry.origin_device_id == device.device_id


def _recipient(
    user_id: str, device: PresenceEntry, entry: SyncEntry, *, own: bool
) -> PushRecipient:
    return PushRecipient(
        connection_id=device.connection_id,
        session_epoch=device.session_epoch,
        user_id=user_id,
        device_id=device.device_id,
        mailbox_seq=entry.mailbox_seq,
        event_ordinal=entry.event_ordinal,
        event_id=entry.event_id,
        flags=entry.flags,
        mention_type=entry.mention_type,
        visibility_floor_conversation_seq=entry.visibility_floor_conversation_seq,
        client_message_id=entry.client_message_id if own else None,
        origin_device_id=entry.origin_device_id,
        target_sender_id=entry.target_sender_id,
        target_flags=entry.target_flags,
        target_mention_type=entry.target_mention_type,
    )
