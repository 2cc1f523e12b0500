"""ReactionPush: a message's merged REACTION_UPDATE for one ConnectionShard, as a Kafka record.

ConversationWriter -> ConnectionNode on ``qim.to-gateway``, **explicit partition =
connection_shard** (the recipients' own, ``connection_shard_id`` of their user bucket), tagged
``kind="reaction_push"`` so it shares the topic with ``WriterReply`` and ``PushBatch``. It never
reaches a mailbox: the gateway owning the shard writes one ``REACTION_UPDATE`` to every live
session of each ``recipients`` user it holds, and drops the rest (an offline member reads the
aggregate with the message, 13.6.3 item 1).

``counts`` / ``summary_version`` are the message's absolute aggregate after the last reaction of
the merge window (13.6.3 item 2). ``self_keys`` maps each recipient who reacted in the window to
its own keys after its last reaction there; everyone else gets ``self_reaction_keys`` omitted
(None: "yours did not change"), so the SDK keeps what it holds (``qim.client.reactions``).
Kafka key: ``(tenant, conversation_id)``; the partition is explicit anyway.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.frames.reactions import ReactionUpdate
from qim.schemas.hashing import hash_input, validate_identifier

__all__ = ["ReactionPush", "decode_reaction_push", "encode_reaction_push"]


class ReactionPush(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="reaction_push",
):
    """One message's REACTION_UPDATE for the users of one ConnectionShard (module doc)."""

    tenant_id: str
    connection_shard: U32
    conversation_id: str
    conversation_seq: U64
    counts: dict[str, U32] = msgspec.field(default_factory=dict)
    summary_version: U64
    recipients: tuple[str, ...] = ()
    self_keys: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)

    @property
    def key(self) -> bytes:
        validate_identifier(self.tenant_id, "tenant_id")
        validate_identifier(self.conversation_id, "conversation_id")
        return hash_input(self.tenant_id, self.conversation_id)

    @property
    def partition(self) -> int:
        """The explicit to-gateway partition: the recipients' ConnectionShard."""
        return self.connection_shard

    def update_for(self, user_id: str) -> ReactionUpdate:
        """The frame ``user_id``'s sessions get."""
        return ReactionUpdate(
            conversation_id=self.conversation_id,
            conversation_seq=self.conversation_seq,
            counts=dict(self.counts),
            summary_version=self.summary_version,
            self_reaction_keys=self.self_keys.get(user_id),
        )


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(ReactionPush)


def encode_reaction_push(record: ReactionPush) -> bytes:
    return _ENCODER.encode(record)


def decode_reaction_push(data: bytes) -> ReactionPush:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` on anything else."""
    return _DECODER.decode(data)
