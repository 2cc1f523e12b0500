"""The opcode table: every client-visible frame of App. A.3/A.4 with its value, direction,
default stream and body model(s).

Opcode values (A.2 gives ranges, docs/01 fixes values; only LEAVE_GROUP = 0x0A04 is given): each
range is numbered from ``base + 1`` in A.2's listing order; [ext] frames (not in App. A) follow
the spec's frames of their range. ``0x??00`` stays unassigned so an
all-zero header never decodes as a real frame.

Default stream (A.5 fixes 0-3 for 17 frames; the rest are this table's choice, one rule): a
request travels on the stream its reply uses, so one stream's order covers the exchange; small
request/notify frames go on 1 (realtime), paged lists on 2 (bulk), rooms on 3, session control
on 0. ONLINE_READY is on 1 so it cannot overtake or trail the PUSH_EVENTS it releases. Receivers
accept any frame on any stream: stream_id schedules writes, it does not type frames.

Internal frames (PushBatch, PRESENCE_STALE) never reach a client socket. Their opcodes are
reserved in the vendor range in :data:`INTERNAL_OPCODES`, without models here; the decoder
treats them as a direction violation on a client connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, Flag
from typing import Final

from qim.schemas.frames import connection as c
from qim.schemas.frames import control as ct
from qim.schemas.frames import e2ee as e
from qim.schemas.frames import history as h
from qim.schemas.frames import mailbox as mb
from qim.schemas.frames import media as md
from qim.schemas.frames import members as mm
from qim.schemas.frames import messaging as ms
from qim.schemas.frames import reactions as r
from qim.schemas.frames import room as rm
from qim.schemas.frames import rtc
from qim.schemas.frames.base import Body
from qim.schemas.frames.exceptions import WrongDirection

__all__ = [
    "FRAMES_BY_NAME",
    "FRAMES_BY_OPCODE",
    "INTERNAL_OPCODES",
    "OPCODE_RANGES",
    "Direction",
    "FrameSpec",
    "Role",
    "Stream",
    "check_direction",
    "spec_for_model",
]


class Role(Enum):
    """Which end of the connection a codec object runs on."""

    CLIENT = "client"
    SERVER = "server"


class Direction(Flag):
    UPLINK = 1  # client -> server
    DOWNLINK = 2  # server -> client
    BOTH = UPLINK | DOWNLINK


class Stream:
    """A.5 streams."""

    CONTROL: Final = 0
    REALTIME: Final = 1
    BULK: Final = 2
    ROOM: Final = 3


@dataclass(frozen=True, slots=True)
class FrameSpec:
    """One row of the frame table."""

    name: str
    opcode: int
    direction: Direction
    stream: int
    uplink: type[Body] | None = None
    downlink: type[Body] | None = None

    def model_sent_by(self, sender: Role) -> type[Body] | None:
        return self.uplink if sender is Role.CLIENT else self.downlink


# A.2 opcode ranges: (first, last, group).
OPCODE_RANGES: Final[tuple[tuple[int, int, str], ...]] = (
    (0x0000, 0x00FF, "connection & session"),
    (0x0100, 0x01FF, "mailbox sync"),
    (0x0200, 0x02FF, "messaging"),
    (0x0300, 0x03FF, "history & session list"),
    (0x0400, 0x04FF, "control & state"),
    (0x0500, 0x05FF, "chatroom"),
    (0x0600, 0x06FF, "RTC signalling"),
    (0x0700, 0x07FF, "media"),
    (0x0800, 0x08FF, "E2EE keys"),
    (0x0900, 0x09FF, "reactions"),
    (0x0A00, 0x0AFF, "conversation members"),
    (0xF000, 0xFFFF, "reserved / vendor extensions"),
)

INTERNAL_OPCODES: Final[dict[str, int]] = {
    "PushBatch": 0xF001,  # MailboxNode -> ConnectionNode (§11.1)
    "PRESENCE_STALE": 0xF002,  # ConnectionNode -> MailboxNode (§5.4)
}

_U, _D, _B = Direction.UPLINK, Direction.DOWNLINK, Direction.BOTH
_CTL, _RT, _BULK, _ROOM = Stream.CONTROL, Stream.REALTIME, Stream.BULK, Stream.ROOM


def _up(name: str, opcode: int, stream: int, model: type[Body]) -> FrameSpec:
    return FrameSpec(name, opcode, _U, stream, uplink=model)


def _down(name: str, opcode: int, stream: int, model: type[Body]) -> FrameSpec:
    return FrameSpec(name, opcode, _D, stream, downlink=model)


def _both(name: str, opcode: int, stream: int, up: type[Body], down: type[Body]) -> FrameSpec:
    return FrameSpec(name, opcode, _B, stream, uplink=up, downlink=down)


_TABLE: Final[tuple[FrameSpec, ...]] = (
    # 0x00 connection & session
    _up("AUTH", 0x0001, _CTL, c.Auth),
    _down("AUTH_OK", 0x0002, _CTL, c.AuthOk),
    _up("PING", 0x0003, _CTL, c.Ping),
    _down("PONG", 0x0004, _CTL, c.Pong),
    _down("REDIRECT", 0x0005, _CTL, c.Redirect),
    _down("KICKED", 0x0006, _CTL, c.Kicked),
    _down("ERROR", 0x0007, _CTL, c.Error),
    # 0x01 mailbox sync
    _up("PULL_MAILBOX", 0x0101, _BULK, mb.PullMailbox),
    _down("MAILBOX_BATCH", 0x0102, _BULK, mb.MailboxBatch),
    _up("SYNC_COMPLETE", 0x0103, _BULK, mb.SyncComplete),
    _down("ONLINE_READY", 0x0104, _RT, mb.OnlineReady),
    # 0x02 messaging
    _up("SEND_MESSAGE", 0x0201, _RT, ms.SendMessage),
    _down("SEND_ACK", 0x0202, _RT, ms.SendAck),
    _down("PUSH_EVENTS", 0x0203, _RT, ms.PushEvents),
    # 0x03 history & session list
    _up("PULL_HISTORY", 0x0301, _BULK, h.PullHistory),
    _down("HISTORY_BATCH", 0x0302, _BULK, h.HistoryBatch),
    _up("PULL_SESSION_LIST", 0x0303, _BULK, h.PullSessionList),
    _down("SESSION_LIST_BATCH", 0x0304, _BULK, h.SessionListBatch),
    _down("SESSION_DELTA", 0x0305, _RT, h.SessionDelta),
    _down("BADGE_UPDATE", 0x0306, _RT, h.BadgeUpdate),
    # 0x04 control & state
    _up("MARK_READ", 0x0401, _RT, ct.MarkRead),
    _up("RECALL", 0x0402, _RT, ct.Recall),
    _up("EDIT", 0x0403, _RT, ct.Edit),
    _both("TYPING", 0x0404, _RT, ct.Typing, ct.TypingDown),
    _both("PRESENCE_SUB", 0x0405, _RT, ct.PresenceSub, ct.PresenceSubDown),
    _down("READ_SYNC", 0x0406, _RT, ct.ReadSync),
    _up("CONVERSATION_STATE", 0x0407, _RT, ct.ConversationState),  # [ext]
    # 0x05 chatroom
    _up("ROOM_JOIN", 0x0501, _ROOM, rm.RoomJoin),
    _up("ROOM_LEAVE", 0x0502, _ROOM, rm.RoomLeave),
    _up("ROOM_REPLAY", 0x0503, _ROOM, rm.RoomReplay),
    _down("ROOM_BATCH", 0x0504, _ROOM, rm.RoomBatch),
    # 0x06 RTC, 0x07 media
    _both("RTC_SIGNAL", 0x0601, _RT, rtc.RtcSignal, rtc.RtcSignalDown),  # downlink [ext]
    _up("MEDIA_TICKET", 0x0701, _RT, md.MediaTicket),
    # 0x08 E2EE keys
    _up("PREKEY_PUBLISH", 0x0801, _RT, e.PrekeyPublish),
    _both("PREKEY_FETCH", 0x0802, _RT, e.PrekeyFetch, e.PrekeyFetchDown),
    # 0x09 reactions
    _up("REACT", 0x0901, _RT, r.React),
    _down("REACTION_UPDATE", 0x0902, _RT, r.ReactionUpdate),
    _up("PULL_REACTIONS", 0x0903, _BULK, r.PullReactions),
    _down("REACTION_LIST", 0x0904, _BULK, r.ReactionList),
    # 0x0A conversation members
    _up("PULL_MEMBERS", 0x0A01, _BULK, mm.PullMembers),
    _down("MEMBER_LIST_BATCH", 0x0A02, _BULK, mm.MemberListBatch),
    _up("CREATE_GROUP", 0x0A03, _BULK, mm.CreateGroup),
    _up("LEAVE_GROUP", 0x0A04, _BULK, mm.LeaveGroup),  # fixed by ADR-0021
)

FRAMES_BY_NAME: Final[dict[str, FrameSpec]] = {f.name: f for f in _TABLE}
FRAMES_BY_OPCODE: Final[dict[int, FrameSpec]] = {f.opcode: f for f in _TABLE}
_BY_MODEL: Final[dict[type[Body], FrameSpec]] = {
    model: f for f in _TABLE for model in (f.uplink, f.downlink) if model is not None
}
_INTERNAL: Final = frozenset(INTERNAL_OPCODES.values())


def spec_for_model(model: type[Body]) -> FrameSpec:
    """The frame a body class belongs to; KeyError for nested structs such as SyncEntry."""
    return _BY_MODEL[model]


def check_direction(opcode: int, sender: Role) -> FrameSpec | None:
    """The spec row for ``opcode`` if ``sender`` may send it; None if the opcode is unknown.

    Raises WrongDirection for an uplink-only frame from a server, a downlink-only frame from a
    client, or an internal (PushBatch / PRESENCE_STALE) opcode on a client connection.
    """
    spec = FRAMES_BY_OPCODE.get(opcode)
    if spec is None:
        if opcode in _INTERNAL:
            raise WrongDirection(f"internal opcode 0x{opcode:04X} on a client connection")
        return None
    if spec.model_sent_by(sender) is None:
        raise WrongDirection(f"{spec.name} may not be sent by the {sender.value}", opcode=opcode)
    return spec
