"""A ``UserStateCommand`` on the shard log -> the 7.5 row, the CONTROL entry, the projection.

Why the head comes from the user's projection: mark unread, clear history and delete stamp
``head.latest_conversation_seq`` at the moment of the action (7.5, 12.9, 12.10); on the shard
that moment is the command's log position, and the user's projection row holds the latest
``conversation_seq`` folded before it, so replay stamps the same value. A command that changes
nothing (a MARK_READ below the watermark, 7.5 forward only) writes nothing: no CONTROL entry,
no projection touch.

The CONTROL entry (12.9's table: "in mailbox? yes") carries the post-change state as an inline
body of custom type :data:`USER_STATE_CUSTOM_TYPE` (absolute values: a device applies it with
7.5's merge) and the asking device in ``origin_device_id`` (never echoed to it, 9.7).
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.core.mailbox.expand import EntryRow
from qim.core.mailbox.sessions import SessionFolds, decode_state, encode_state, state_key
from qim.core.mailbox.values import StoredEntry
from qim.core.session_list import (
    BANNED,
    LEFT,
    REMOVED,
    ClearHistory,
    DeleteLocal,
    Join,
    Leave,
    MarkRead,
    MarkUnread,
    SetArchived,
    SetMuted,
    SetNotificationPolicy,
    SetPin,
    SetRole,
    UserChange,
    UserConversationState,
    apply_change,
)
from qim.schemas.events import EventType, event_id
from qim.schemas.frames.base import U128_ZERO
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import MEMBERSHIP_CUSTOM_TYPE, decode_control
from qim.schemas.records.user_state import UserStateCommand

__all__ = [
    "USER_STATE_CUSTOM_TYPE",
    "apply_command",
    "apply_membership",
    "change_of",
    "membership_change",
]

USER_STATE_CUSTOM_TYPE: Final = "qim.user_state"


def change_of(c: UserStateCommand, head_latest: int) -> UserChange | None:
    """The 7.5 change a command asks for; None for an unknown action (a newer build's)."""
    match c.action:
        case "mark_read":
            return MarkRead(c.read_conversation_seq)
        case "mark_unread":
            return MarkUnread(head_latest) if head_latest else None
        case "clear_history":
            return ClearHistory(head_latest)
        case "delete":
            return DeleteLocal(head_latest)
        case "pin":
            return SetPin(c.pin_rank)
        case "mute":
            return SetMuted(c.flag)
        case "archive":
            return SetArchived(c.flag)
        case "notification_policy":
            return SetNotificationPolicy(c.notification_policy or "ALL")
    return None


def apply_command(sessions: SessionFolds, seq: int, c: UserStateCommand) -> list[EntryRow]:
    """Apply ``c`` at ``seq``; returns the user's CONTROL entry to write (empty: a no-op)."""
    tenant, user, conv = c.tenant_id, c.user_id, c.conversation_id
    raw = sessions.kv.get(state_key(tenant, user, conv))
    old = UserConversationState(conversation_id=conv) if raw is None else decode_state(raw)
    if old.updated_activity_id >= seq:
        # The row already reflects this position: restored from the UserConversationState
        # changelog (or a checkpoint) ahead of the log being replayed. Never true in log order
        # (a change stamps its own, larger seq), so a plain replay is unchanged.
        return []
    row = sessions.projection(tenant, user, [conv]).rows.get(conv)
    change = change_of(c, 0 if row is None else row.latest_conversation_seq)
    if change is None:
        return []
    new = apply_change(old, change, activity_id=seq)
    if new is old:
        return []
    eid = event_id(tenant, c.command_id, user, EventType.CONTROL)
    advanced = new.read_conversation_seq > old.read_conversation_seq
    sessions.state(
        tenant, user, seq, eid, new, read_origin=c.origin_device_id if advanced else None
    )
    entry = StoredEntry(
        event_type=int(EventType.CONTROL),
        message_id=c.command_id,
        conversation_id=conv,
        conversation_seq=new.read_conversation_seq,
        last_activity_id=U128_ZERO,
        sender_id=user,
        created_at=c.committed_at,
        origin_device_id=c.origin_device_id or None,
        inline=True,
        inline_custom_type=USER_STATE_CUSTOM_TYPE,
        inline_payload=encode_state(new),
    )
    return [EntryRow(event_ordinal=int(EventType.CONTROL), event_id=eid, entry=entry)]


_ENDS: Final = {"leave": LEFT, "remove": REMOVED, "ban": BANNED, "dissolve": REMOVED}


def membership_change(d: GroupDispatch, user_id: str) -> UserChange | None:
    """The 7.5 membership change a MEMBERSHIP dispatch makes for one of its recipients: a
    join (create/add; the creator as OWNER), a leave (leave/remove/ban/dissolve) or a role
    (set_role/transfer) at its ``conversation_seq``, for the users it names; None for
    everyone else (a notice to the remaining members)."""
    if d.event_type != EventType.MEMBERSHIP or d.custom_type != MEMBERSHIP_CUSTOM_TYPE:
        return None
    try:
        control = decode_control(d.payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    subjects = set(control.targets)
    if control.action in ("create", "leave"):
        subjects.add(control.actor)
    if control.action == "transfer" and control.previous_owner:
        subjects.add(control.previous_owner)
    if control.action == "create":
        # a create reaches exactly its initial members (the fanout names them all, of every
        # chunk, while the payload lists only its own chunk's invitees)
        subjects.add(user_id)
    if user_id not in subjects:
        return None
    if control.action in _ENDS:
        return Leave(d.conversation_seq, _ENDS[control.action])
    if control.action == "create" and user_id == control.actor:
        return Join(d.conversation_seq, "OWNER")
    if control.action in ("create", "add"):
        return Join(d.conversation_seq)
    if control.action == "set_role" and control.role:
        return SetRole(d.conversation_seq, control.role)
    if control.action == "transfer" and control.role:
        role = control.role if user_id == control.previous_owner else "OWNER"
        return SetRole(d.conversation_seq, role)
    return None


def apply_membership(
    sessions: SessionFolds, seq: int, d: GroupDispatch, user_id: str, event_id: int
) -> None:
    """Fold a member's own join/leave as state at the MEMBERSHIP entry's position, before
    the entry itself (a re-join's entry is visible only under the new state)."""
    change = membership_change(d, user_id)
    if change is None:
        return
    tenant, conv = d.tenant_id, d.conversation_id
    raw = sessions.kv.get(state_key(tenant, user_id, conv))
    old = UserConversationState(conversation_id=conv) if raw is None else decode_state(raw)
    new = apply_change(old, change, activity_id=seq)
    if new is not old:
        sessions.state(tenant, user_id, seq, event_id, new)
