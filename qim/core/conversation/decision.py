"""What ``ConversationWriterState.handle_send`` returns: plain data for the shell to execute.

Four outcomes, and what the Faust/Kafka shell does with each:

* :class:`Rejected` - produce ``reply`` (an ERROR) to ``qim.to-gateway``. Nothing was allocated:
  no message_id, conversation_seq, last_activity_id, token or dedup entry (spec 8.2 I-1).
* :class:`Duplicate` - produce ``reply`` (the stored SEND_ACK, this request's ``request_id``).
  It refers to a record the state has applied; in a pipelined shell that record's append may
  still be in flight, so replies go out in decision order, each after every append issued
  before it is durable (SEND_ACK means durable commit, direction.md 4.6).
* :class:`Accepted` - append ``record`` to ``qim.outbox`` (key ``record_key``), call
  ``state.apply(record)``, and produce ``reply`` only once the append is acknowledged with
  ``acks=all``. Applying is what allocates: until then the state is untouched, so a crash between
  the decision and the append loses nothing (the client's retry is decided afresh; it gets the
  same seq and, at a later wall clock, a later message_id). A pipelined shell may apply before
  the append is acknowledged, so the next request is decided without waiting; if that append
  then fails, the state is ahead of the log and must be rebuilt (``restore`` + replay of the
  outbox) before anything else is decided, and the lost record's ack is never sent.
* :class:`Transient` - an ``ephemeral`` custom type (13.3): append **nothing**; write
  ``entry`` to the members' online devices (``qim.core.transient.ephemeral_relays``, sent with
  the replies) and produce ``reply``, a SEND_ACK with ``conversation_seq`` 0. Its transient
  ``message_id`` is the only trace, in memory (no snapshot, no log).
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.core.conversation.membership import Target
from qim.schemas.frames.connection import Error
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.messaging import SendAck
from qim.schemas.records.outbox import MessageCommitted
from qim.schemas.records.requests import SendRequest, WriterReply, conversation_key, reply_for

__all__ = [
    "Accepted",
    "Decision",
    "Duplicate",
    "Rejected",
    "Transient",
    "ack_reply",
    "error_reply",
]


@dataclass(frozen=True, slots=True)
class Rejected:
    """An ERROR for the sender; ``reason`` is a short label for logs and metrics."""

    reply: WriterReply
    reason: str

    @property
    def code(self) -> ErrorCode:
        assert self.reply.error is not None
        return ErrorCode(self.reply.error.code)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of a committed send: the same SEND_ACK, no new coordinates (spec 8.3)."""

    reply: WriterReply


@dataclass(frozen=True, slots=True)
class Accepted:
    """A new message: append ``record``, apply it, then send ``reply`` once durable."""

    record: MessageCommitted
    reply: WriterReply

    @property
    def record_key(self) -> bytes:
        return conversation_key(self.record.tenant_id, self.record.conversation_id)


@dataclass(frozen=True, slots=True)
class Transient:
    """An ephemeral message: relay ``entry`` to ``target``'s online devices, send ``reply``."""

    entry: SyncEntry
    reply: WriterReply
    target: Target


Decision = Rejected | Duplicate | Accepted | Transient


def error_reply(
    request: SendRequest, code: ErrorCode, retry_after_ms: int | None = None, detail: str = ""
) -> WriterReply:
    """ERROR{code, retry_after_ms, request_id} addressed to the sender's connection."""
    error = Error(
        code=int(code),
        retry_after_ms=retry_after_ms,
        detail=detail,
        request_id=request.request_id,
    )
    return reply_for(request, error=error)


def ack_reply(
    request: SendRequest, message_id: bytes, conversation_seq: int, last_activity_id: bytes
) -> WriterReply:
    """SEND_ACK with all five fields of spec 8.4, echoing ``client_message_id``."""
    ack = SendAck(
        request_id=request.request_id,
        client_message_id=request.message.client_message_id,
        message_id=message_id,
        conversation_seq=conversation_seq,
        last_activity_id=last_activity_id,
    )
    return reply_for(request, send_ack=ack)
