"""Request/response correlation by ``request_id``, without I/O (the waiter type is generic).

Each request takes a fresh u32 ``request_id`` (never 0: 0 marks server-initiated frames, A.1)
that is not in flight; the reply carries it back in its header. ERROR repeats it in its body
too (A.4 #21), and a header of 0 there falls back to the body's value.

Two replies are also accepted with ``request_id`` 0, matched by content, because the spec
names their pairing by field rather than by header: a PONG is matched to its PING by
``ping_id`` (A.3 #12 / A.4 #11), and ONLINE_READY completes the oldest SYNC_COMPLETE in
flight (§9.3: "C->S SYNC_COMPLETE; S->C ONLINE_READY").

:data:`EXPECTED_REPLIES` is App. A's pairing of requests and replies; a reply of another type
(ERROR aside) is a server bug the caller reports as :class:`UnexpectedFrame`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Generic, TypeVar

import msgspec

from qim.schemas.frames import (
    Auth,
    AuthOk,
    Body,
    CreateGroup,
    Error,
    Frame,
    HistoryBatch,
    LeaveGroup,
    MailboxBatch,
    MemberListBatch,
    OnlineReady,
    Ping,
    Pong,
    PrekeyFetch,
    PrekeyFetchDown,
    PrekeyPublish,
    PresenceSub,
    PresenceSubDown,
    PullHistory,
    PullMailbox,
    PullMembers,
    PullReactions,
    PullSessionList,
    React,
    ReactionList,
    ReactionUpdate,
    RoomBatch,
    RoomJoin,
    RoomLeave,
    RoomReplay,
    SendAck,
    SendMessage,
    SessionListBatch,
    SyncComplete,
    spec_for_model,
)

__all__ = ["EXPECTED_REPLIES", "Match", "RequestTable", "stamp_request_id"]

W = TypeVar("W")

_U32_MAX: Final = 0xFFFF_FFFF

# request body -> reply bodies App. A names for it (ERROR is always possible).
EXPECTED_REPLIES: Final[Mapping[type[Body], tuple[type[Body], ...]]] = MappingProxyType(
    {
        Auth: (AuthOk,),  # a re-AUTH on a live connection (§15.3.1 silent renewal)
        Ping: (Pong,),
        PullMailbox: (MailboxBatch,),
        SyncComplete: (OnlineReady,),
        SendMessage: (SendAck,),
        PullHistory: (HistoryBatch,),
        PullSessionList: (SessionListBatch,),
        PresenceSub: (PresenceSubDown,),
        RoomJoin: (RoomBatch,),
        RoomLeave: (RoomBatch,),  # 14.5: the acknowledgement, no events
        RoomReplay: (RoomBatch,),
        PrekeyFetch: (PrekeyFetchDown,),
        PrekeyPublish: (PrekeyFetchDown,),  # ours: the device's stored bundle (A.3 names none)
        PullReactions: (ReactionList,),
        React: (ReactionUpdate,),
        PullMembers: (MemberListBatch,),
        CreateGroup: (MemberListBatch,),
        LeaveGroup: (MemberListBatch,),
    }
)


def stamp_request_id(body: Body, request_id: int) -> Body:
    """Copy ``request_id`` into a body that repeats it (SEND_MESSAGE, A.3 #4)."""
    if "request_id" in body.__struct_fields__:
        return msgspec.structs.replace(body, request_id=request_id)
    return body


@dataclass(frozen=True, slots=True)
class Match(Generic[W]):
    """A reply paired with its request."""

    request_id: int
    waiter: W
    request: Body

    @property
    def frame_name(self) -> str:
        return spec_for_model(type(self.request)).name

    def expects(self, reply: Body) -> bool:
        """True for ERROR, for a request without a table entry, or an allowed reply type."""
        allowed = EXPECTED_REPLIES.get(type(self.request))
        return isinstance(reply, Error) or allowed is None or isinstance(reply, allowed)


class RequestTable(Generic[W]):
    """Requests in flight: request_id -> (waiter, request body)."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[W, Body]] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._pending)

    def open(self, request: Body, waiter: W) -> int:
        """Register a request and return its fresh request_id."""
        if len(self._pending) >= _U32_MAX:
            raise RuntimeError("every request_id is in flight")
        request_id = self._next
        while request_id in self._pending:
            request_id = request_id % _U32_MAX + 1
        self._next = request_id % _U32_MAX + 1
        self._pending[request_id] = (waiter, request)
        return request_id

    def discard(self, request_id: int, waiter: W) -> None:
        """Forget a request (timeout, cancel) if it is still ``waiter``'s."""
        entry = self._pending.get(request_id)
        if entry is not None and entry[0] is waiter:
            del self._pending[request_id]

    def match(self, frame: Frame) -> Match[W] | None:
        """Pop and return the request ``frame`` answers; None for a server-initiated frame."""
        body = frame.body
        request_id = frame.header.request_id
        if request_id == 0 and isinstance(body, Error):
            request_id = body.request_id
        if request_id == 0:
            request_id = self._match_by_content(body)
        entry = self._pending.pop(request_id, None) if request_id else None
        if entry is None:
            return None
        return Match(request_id, entry[0], entry[1])

    def _match_by_content(self, body: Body) -> int:
        for request_id, (_, request) in self._pending.items():  # insertion order = oldest first
            if isinstance(body, Pong) and isinstance(request, Ping):
                if request.ping_id == body.ping_id:
                    return request_id
            elif isinstance(body, OnlineReady) and isinstance(request, SyncComplete):
                return request_id
        return 0

    def drain(self) -> list[W]:
        """Remove and return every waiter (the connection closed)."""
        waiters = [waiter for waiter, _ in self._pending.values()]
        self._pending.clear()
        return waiters
