"""Stable user routing: virtual buckets, shard masks and lanes (spec §5.2, §6.5.1, App. B.1).

All results are pure arithmetic on one BLAKE3 digest of ``tenant_id || 0x00 || user_id`` so
that every ConnectionNode, MailboxNode and client SDK derives the same placement without a
lookup. The hash, the byte rule and the counts are immutable after cluster creation (§27.2.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from qim.schemas.hashing import blake3_digest, hash_input, validate_identifier

__all__ = [
    "DEFAULT_CONNECTION_SHARD_COUNT",
    "DEFAULT_LANE_COUNT",
    "DEFAULT_MAILBOX_SHARD_COUNT",
    "DEFAULT_VIRTUAL_BUCKET_COUNT",
    "MAX_LANE_COUNT",
    "ShardConfig",
    "connection_shard_id",
    "is_power_of_two",
    "lane_id",
    "mailbox_shard_id",
    "user_bucket",
    "user_routing_input",
    "validate_shard_config",
]

DEFAULT_VIRTUAL_BUCKET_COUNT: Final = 65536
DEFAULT_MAILBOX_SHARD_COUNT: Final = 256
DEFAULT_CONNECTION_SHARD_COUNT: Final = 1024
DEFAULT_LANE_COUNT: Final = 64
MAX_LANE_COUNT: Final = 256  # lane_id uses only digest byte 0
_MAX_VIRTUAL_BUCKET_COUNT: Final = 1 << 64  # user_bucket masks a u64


def is_power_of_two(value: int) -> bool:
    """Counts must be powers of two so that ``& (count - 1)`` is an exact modulus."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return value > 0 and value & (value - 1) == 0


def _require_power_of_two(value: int, name: str) -> None:
    if not is_power_of_two(value):
        raise ValueError(f"{name} must be a power of two, got {value!r}")


def validate_shard_config(
    virtual_bucket_count: int,
    mailbox_shard_count: int,
    connection_shard_count: int,
    lane_count: int,
) -> None:
    """Enforce §5.2 hard constraints; a violation silently mis-routes users, so fail at boot."""
    _require_power_of_two(virtual_bucket_count, "virtual_bucket_count")
    _require_power_of_two(mailbox_shard_count, "mailbox_shard_count")
    _require_power_of_two(connection_shard_count, "connection_shard_count")
    _require_power_of_two(lane_count, "lane_count")
    if virtual_bucket_count > _MAX_VIRTUAL_BUCKET_COUNT:
        raise ValueError("virtual_bucket_count must be <= 2**64 (user_bucket masks a u64)")
    if mailbox_shard_count > virtual_bucket_count:
        raise ValueError("mailbox_shard_count must be <= virtual_bucket_count (§5.2 constraint 1)")
    if connection_shard_count > virtual_bucket_count:
        raise ValueError("connection_shard_count must be <= virtual_bucket_count (§5.2)")
    if connection_shard_count % mailbox_shard_count:
        raise ValueError(
            "connection_shard_count must be an integer multiple of mailbox_shard_count "
            "(§5.2 constraint 2)"
        )
    if lane_count > MAX_LANE_COUNT:
        raise ValueError(f"lane_count must be <= {MAX_LANE_COUNT} (lane uses digest byte 0)")


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """A validated routing configuration; constructing one is the boot-time check."""

    virtual_bucket_count: int = DEFAULT_VIRTUAL_BUCKET_COUNT
    mailbox_shard_count: int = DEFAULT_MAILBOX_SHARD_COUNT
    connection_shard_count: int = DEFAULT_CONNECTION_SHARD_COUNT
    lane_count: int = DEFAULT_LANE_COUNT

    def __post_init__(self) -> None:
        validate_shard_config(
            self.virtual_bucket_count,
            self.mailbox_shard_count,
            self.connection_shard_count,
            self.lane_count,
        )


def user_routing_input(tenant_id: str, user_id: str) -> bytes:
    """``tenant_id || 0x00 || user_id`` -- shared by user_bucket and lane_id (§5.2, §6.5.1)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(user_id, "user_id")
    return hash_input(tenant_id, user_id)


def user_bucket(
    tenant_id: str, user_id: str, virtual_bucket_count: int = DEFAULT_VIRTUAL_BUCKET_COUNT
) -> int:
    """``be_u64(blake3(tenant||0x00||user)[0:8]) & (vbc-1)``: the LOW bits of digest bytes 0..7."""
    _require_power_of_two(virtual_bucket_count, "virtual_bucket_count")
    if virtual_bucket_count > _MAX_VIRTUAL_BUCKET_COUNT:
        raise ValueError("virtual_bucket_count must be <= 2**64")
    digest = blake3_digest(user_routing_input(tenant_id, user_id))
    return int.from_bytes(digest[:8], "big") & (virtual_bucket_count - 1)


def _mask_shard(bucket: int, shard_count: int, name: str) -> int:
    _require_power_of_two(shard_count, name)
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
        raise ValueError(f"user_bucket must be a non-negative int, got {bucket!r}")
    return bucket & (shard_count - 1)


def mailbox_shard_id(bucket: int, mailbox_shard_count: int = DEFAULT_MAILBOX_SHARD_COUNT) -> int:
    """Initial mapping by mask (§5.2); after a split ShardRegistry's versioned table wins."""
    return _mask_shard(bucket, mailbox_shard_count, "mailbox_shard_count")


def connection_shard_id(
    bucket: int, connection_shard_count: int = DEFAULT_CONNECTION_SHARD_COUNT
) -> int:
    """Same bucket, wider mask: a MailboxShard's users land on exactly conn/mailbox shards."""
    return _mask_shard(bucket, connection_shard_count, "connection_shard_count")


def lane_id(tenant_id: str, user_id: str, lane_count: int = DEFAULT_LANE_COUNT) -> int:
    """Digest byte 0 masked: independent of buckets so splits never move a user's lane."""
    _require_power_of_two(lane_count, "lane_count")
    if lane_count > MAX_LANE_COUNT:
        raise ValueError(f"lane_count must be <= {MAX_LANE_COUNT}")
    return blake3_digest(user_routing_input(tenant_id, user_id))[0] & (lane_count - 1)
