"""Messaging frames, opcodes 0x0200-0x02FF: SEND_MESSAGE, SEND_ACK, PUSH_EVENTS."""

from __future__ import annotations

from qim.schemas.frames.base import U8, U32, U64, U128, U128_ZERO, Body
from qim.schemas.frames.mailbox import SyncEntry

__all__ = ["PushEvents", "SendAck", "SendMessage"]


class SendMessage(Body):
    """SEND_MESSAGE (A.3 #4).

    ``request_id`` repeats the header's: A.3 lists it as a body field and SEND_ACK echoes it.
    ``custom_type`` is a separate field (not inside ``payload``) so routing works on E2EE
    ciphertext; at most ``custom_type_max_bytes`` (64) UTF-8 octets, checked by the decoder.
    ``mention_targets`` holds user ids, or ``MENTION_ALL`` for @all (§7.1).
    """

    request_id: U32 = 0
    client_message_id: str = ""
    conversation_id: str = ""
    message_type: U8 = 0  # values owned by the §13.3 type registry
    custom_type: str = ""
    payload: bytes = b""
    mention_targets: tuple[str, ...] = ()
    reply_to_conversation_seq: U64 | None = None
    # Not in A.3 #4: a one-to-one conversation id is a one-way hash of its two users
    # (qim.core.conversation.ids), so a send into one names the other user; empty for groups.
    peer_user_id: str = ""


class SendAck(Body):
    """SEND_ACK (A.4 #6): echoes ``client_message_id`` so the pending bubble upgrades in place."""

    request_id: U32 = 0
    client_message_id: str = ""
    message_id: U128 = U128_ZERO
    conversation_seq: U64 = 0
    last_activity_id: U128 = U128_ZERO


class PushEvents(Body):
    """PUSH_EVENTS (A.4 #5): same entry struct as MAILBOX_BATCH; never advances the cursor."""

    events: tuple[SyncEntry, ...] = ()
    last_pushed_user_seq: U64 = 0
