"""B.1 Sharding and routing, B.2 Sequences and idempotency."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import SECOND, KiB

__all__ = ["SequencesAndIdempotency", "ShardingAndRouting"]


class ShardingAndRouting:
    """B.1: how users map to buckets, shards and lanes (§5.2, §6.5.1)."""

    virtual_bucket_count = Param(
        "virtual_bucket_count",
        65536,
        "count",
        "B.1",
        "Stable virtual buckets every user hashes into; power of two (§5.2).",
        immutable=True,
        minimum=1,
        per_tenant=False,
    )
    bucket_hash = Param(
        "bucket_hash",
        "blake3",
        "enum",
        "B.1",
        "user_bucket = be_u64(blake3(tenant_id || 0x00 || user_id)[0:8]) "
        "& (virtual_bucket_count-1) (§5.2, same level as §27.2.4).",
        immutable=True,
        per_tenant=False,
        choices=("blake3",),
    )
    mailbox_shard_count = Param(
        "mailbox_shard_count",
        64,
        "count",
        "B.1",
        "MailboxShards = dispatch partitions; power of two, <= virtual_bucket_count (§5.2).",
        minimum=1,
        per_tenant=False,
        note=(
            "Local deviation (direction §6): Appendix B's default is 256 with a start tier of "
            "64; one machine starts at the 64 start tier. Configuration, not immutable: a change "
            "goes through the §5.5 split procedure."
        ),
    )
    connection_shard_count = Param(
        "connection_shard_count",
        256,
        "count",
        "B.1",
        "ConnectionShards; power of two and a multiple of mailbox_shard_count (§5.2).",
        minimum=1,
        per_tenant=False,
        note=(
            "Local deviation (direction §6): Appendix B's default is 1024; one machine starts at "
            "256, a multiple of mailbox_shard_count (§5.2 constraint 2), so a MailboxShard's users "
            "still fall on exactly 4 ConnectionShards as at target."
        ),
    )
    lane_count = Param(
        "lane_count",
        64,
        "count",
        "B.1",
        "Lanes per MailboxShard; power of two and <= 256 (lane_id uses blake3 byte 0, §6.5.1).",
        immutable=True,
        minimum=1,
        per_tenant=False,
    )
    shard_lease_ttl = Param(
        "shard_lease_ttl",
        15 * SECOND,
        "ms",
        "B.1",
        "Shard lease duration.",
        per_tenant=False,
        note=(
            "Our shard lease is Kafka group membership (direction §4.1): the owning consumer "
            "group's session timeout is set from this value."
        ),
    )
    redirect_max_per_connection = Param(
        "redirect_max_per_connection",
        1,
        "count",
        "B.1",
        "Max REDIRECTs one connection may follow.",
        per_tenant=False,
    )
    route_token_ttl = Param(
        "route_token_ttl",
        60 * SECOND,
        "ms",
        "B.1",
        "Lifetime of a route_token; single use (§20.2).",
        per_tenant=False,
    )


class SequencesAndIdempotency:
    """B.2: sequence allocation, dedup windows and event groups."""

    clock_regression_reject_ms = Param(
        "clock_regression_reject_ms",
        5000,
        "ms",
        "B.2",
        "Clock step-back beyond this -> CLOCK_UNSAFE; smaller steps are absorbed by the HLC.",
        per_tenant=False,
    )
    conversation_seq_reserve_window = Param(
        "conversation_seq_reserve_window",
        4096,
        "count",
        "B.2",
        "conversation_seq numbers reserved durably at a time (§6.3).",
        per_tenant=False,
    )
    message_seq_bucket_width = Param(
        "message_seq_bucket_width",
        4096,
        "count",
        "B.2",
        "seq_bucket width of MessageRecord partitions.",
        immutable=True,
        per_tenant=False,
    )
    client_dedup_ttl_seconds = Param(
        "client_dedup_ttl_seconds",
        7200,
        "s",
        "B.2",
        "Server ClientDedup window (ADR-0008; paired with the §27.3.2 login reconciliation).",
        per_tenant=False,
    )
    mailbox_event_group_max_items = Param(
        "mailbox_event_group_max_items",
        8,
        "count",
        "B.2",
        "Max entries in one event group (§6.7).",
        per_tenant=False,
    )
    mailbox_event_group_max_bytes = Param(
        "mailbox_event_group_max_bytes",
        8 * KiB,
        "bytes",
        "B.2",
        "Max bytes of an event group; a single entry is <= 1/8 of it (case 26.3.1).",
        per_tenant=False,
    )
    fanout_retry_max_window = Param(
        "fanout_retry_max_window",
        60 * SECOND,
        "ms",
        "B.2",
        "Upper bound of the reordering window and lower bound of the client local_dedup "
        "window; not a drop threshold.",
        per_tenant=False,
    )
    membership_version_merge_window = Param(
        "membership_version_merge_window",
        30 * SECOND,
        "ms",
        "B.2",
        "High-churn groups merge membership changes into one version over this window.",
        per_tenant=False,
    )
    slot_compaction_ratio = Param(
        "slot_compaction_ratio",
        4,
        "factor",
        "B.2",
        "Member slot compaction ratio (§7.9).",
        per_tenant=False,
    )
