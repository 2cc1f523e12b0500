"""UserQuota: a user's ``max_conversations_per_user`` state, as the MailboxNode counts it (I-26).

On ``qim.user-quota`` (compacted), key ``(tenant, user_id)`` (the ``user_key`` bytes), explicit
partition = the user's MailboxShard: every record of one user comes from the owner of one shard
and lands in one partition, so compaction keeps the latest one and a reader sees the user's
records in the order they were written. Published only when the count crosses the cap (up or
down); the latest record per key is the state, so a republished value changes nothing.
``as_of_mailbox_seq`` is the fold position the count was taken at (for diagnosis only).
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.schemas.frames.base import U32, U64
from qim.schemas.records.requests import user_key

__all__ = ["UserQuota", "decode_user_quota", "encode_user_quota"]


class UserQuota(
    msgspec.Struct,
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
    tag="user_quota",
):
    """``exhausted``: joining one more conversation is refused (``conversations >= cap``)."""

    tenant_id: str
    user_id: str
    conversations: U32
    exhausted: bool
    as_of_mailbox_seq: U64 = 0
    mailbox_shard: U32 = 0

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        return self.mailbox_shard


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(UserQuota)


def encode_user_quota(record: UserQuota) -> bytes:
    return _ENCODER.encode(record)


def decode_user_quota(data: bytes) -> UserQuota:
    return _DECODER.decode(data)
