"""SessionPush: the MailboxNode's session-list frames for one online device (spec 12.6, 9.7).

On ``qim.to-gateway`` at **explicit partition** = the device's ConnectionShard, key ``(tenant,
user_id)``, next to PushBatch. One record per device (a user has a handful): the frames it
carries are absolute values (SESSION_DELTA, BADGE_UPDATE, READ_SYNC; INV-25), so a gateway may
drop a record for a session that is gone without any compensation. ``read_syncs`` never
include the device's own MARK_READ (9.7: no echo to ``origin_device_id``).
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.control import ReadSync
from qim.schemas.frames.history import BadgeUpdate, SessionDelta
from qim.schemas.records.requests import user_key

__all__ = ["SessionPush", "decode_session_push", "encode_session_push"]


class SessionPush(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="session_push",
):
    """The session frames of one fold for one connection (``connection_id``,
    ``session_epoch``: a replaced session drops it)."""

    tenant_id: str
    user_id: str
    device_id: str
    connection_id: str
    session_epoch: U64
    connection_shard: U32
    mailbox_shard: U32 = 0
    deltas: tuple[SessionDelta, ...] = ()
    badge: BadgeUpdate | None = None
    read_syncs: tuple[ReadSync, ...] = ()

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        return self.connection_shard


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(SessionPush)


def encode_session_push(record: SessionPush) -> bytes:
    return _ENCODER.encode(record)


def decode_session_push(data: bytes) -> SessionPush:
    return _DECODER.decode(data)
