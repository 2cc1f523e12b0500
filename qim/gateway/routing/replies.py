"""Which live connection a to-gateway record is for, and the frame it becomes (pure).

The ConversationWriter answers every forwarded request with a :class:`WriterReply` on
``qim.to-gateway`` at partition = the requester's ConnectionShard (direction.md §3). The node
owning that shard finds the connection by (tenant, user, device) in its
:class:`~qim.gateway.devices.DeviceRegistry` and writes the reply body with the request's
``request_id`` (A.1). Nothing here raises on bad input: a record from another producer, a newer
schema or a bug is counted and dropped, never allowed to stop the reply stream.

Verdicts:

* ``DELIVER``: the device's live connection has the reply's ``session_epoch``;
* ``STALE_EPOCH``: the device reconnected since (a larger epoch now holds the slot), so the
  answer belongs to a session that no longer exists (§15.2.2: epochs decide, never arrival);
  its request is retried by the client on the new session with the same client_message_id;
* ``NO_SESSION``: the device is not connected here (closed, or the shard moved meanwhile);
* ``UNKNOWN_KIND``: another record kind shares the topic (the mailbox app's PushBatch,
  ``GatewayRecord`` grows, §27.2.1) and has no handler yet;
* ``MALFORMED``: not a decodable record at all (or a null value).
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Generic, TypeVar

import msgspec

from qim.gateway.actions import Send
from qim.gateway.devices import DeviceRegistry
from qim.schemas.frames import Error, SendAck
from qim.schemas.records.requests import WriterReply, decode_writer_reply

__all__ = ["ReplyVerdict", "Resolved", "record_kind", "reply_send", "resolve_reply"]

K = TypeVar("K", bound=Hashable)

_KIND_LABEL: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")


class ReplyVerdict(Enum):
    DELIVER = "delivered"
    STALE_EPOCH = "stale_session_epoch"
    NO_SESSION = "no_session"
    UNKNOWN_KIND = "unknown_kind"
    MALFORMED = "malformed"


class _Kinded(msgspec.Struct, forbid_unknown_fields=False):
    """Just the tag of any tagged record (``kind``), to tell "not ours" from "broken"."""

    kind: str = ""


_KIND_DECODER: Final = msgspec.msgpack.Decoder(_Kinded)


@dataclass(frozen=True, slots=True)
class Resolved(Generic[K]):
    """What to do with one record; ``conn`` and ``reply`` are set for DELIVER."""

    verdict: ReplyVerdict
    reply: WriterReply | None = None
    conn: K | None = None
    kind: str = ""  # the record's tag, a safe metrics label ("other" when it is not)


def record_kind(value: bytes) -> str | None:
    """The ``kind`` tag of a msgpack record, None when it has none or is not msgpack."""
    try:
        kind = _KIND_DECODER.decode(value).kind
    except (msgspec.DecodeError, ValueError):
        return None
    return kind or None


def _label(kind: str | None) -> str:
    return kind if kind is not None and _KIND_LABEL.fullmatch(kind) else "other"


def resolve_reply(value: bytes | None, registry: DeviceRegistry[K]) -> Resolved[K]:
    """Decode a to-gateway value and find the connection it is for."""
    if not value:
        return Resolved(ReplyVerdict.MALFORMED, kind="null")
    try:
        reply = decode_writer_reply(value)
    except (msgspec.DecodeError, ValueError):
        kind = record_kind(value)
        if kind is None or kind == "reply":  # ours but broken, or no record at all
            return Resolved(ReplyVerdict.MALFORMED, kind=_label(kind))
        return Resolved(ReplyVerdict.UNKNOWN_KIND, kind=_label(kind))
    slot = registry.current(reply.tenant_id, reply.user_id, reply.device_id)
    if slot is None:
        return Resolved(ReplyVerdict.NO_SESSION, reply, kind="reply")
    if slot.session_epoch != reply.session_epoch:
        return Resolved(ReplyVerdict.STALE_EPOCH, reply, kind="reply")
    return Resolved(ReplyVerdict.DELIVER, reply, slot.conn, kind="reply")


def reply_send(reply: WriterReply, version: int) -> Send:
    """The frame for the connection: the reply body on its A.5 stream, the request's id.

    Bodies that repeat ``request_id`` (ERROR, SEND_ACK) get it filled in when the writer left
    it 0, so header and body agree (A.4 #6, #21).
    """
    body = reply.body
    if isinstance(body, Error | SendAck) and body.request_id == 0 and reply.request_id:
        body = msgspec.structs.replace(body, request_id=reply.request_id)
    return Send(body, request_id=reply.request_id, version=version)
