"""B.7 To be measured, and the parameters named only in the chapters' text."""

from __future__ import annotations

from qim.params.param import Param
from qim.params.units import MINUTE
from qim.params.values import FloatRange, PpsBudget

__all__ = ["NamedInProse", "ToBeMeasured"]


class ToBeMeasured:
    """B.7: capacity inputs that must be measured before they feed any conclusion (§25).

    Defaults are the spec's planning values where it gives one, else None (unknown).
    """

    entry_logical_bytes = Param(
        "entry_logical_bytes",
        110,
        "bytes",
        "B.7",
        "Logical size of one mailbox entry (estimate).",
        per_tenant=False,
        to_be_measured=True,
    )
    entry_ondisk_bytes = Param[int | None](
        "entry_ondisk_bytes",
        None,
        "bytes",
        "B.7",
        "Real on-disk size of an entry incl. key-prefix compression, index, WAL, compression.",
        value_type=int,
        per_tenant=False,
        to_be_measured=True,
    )
    lsm_write_amp = Param[float | None](
        "lsm_write_amp",
        None,
        "factor",
        "B.7",
        "LSM write amplification, for device endurance (not storage capacity).",
        value_type=float,
        per_tenant=False,
        to_be_measured=True,
    )
    lsm_space_amp = Param(
        "lsm_space_amp",
        FloatRange(low=1.1, high=1.3),
        "composite",
        "B.7",
        "LSM space amplification, for storage capacity; leveled ≈ 1.1–1.3.",
        per_tenant=False,
        to_be_measured=True,
    )
    mailbox_replicas = Param(
        "mailbox_replicas",
        3,
        "count",
        "B.7",
        "Mailbox store replicas (ScyllaDB RF=3 in the source).",
        per_tenant=False,
        to_be_measured=True,
        note=(
            "Our mailbox store is a per-shard RocksDB rebuilt from the dispatch log (direction "
            "§4.2): durability comes from the Kafka topics' replication factor (1 on one machine)."
        ),
    )
    per_shard_entry_budget = Param(
        "per_shard_entry_budget",
        50_000,
        "per_s",
        "B.7",
        "Sustainable entries/s per MailboxShard (planning 50k).",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_entry_budget = Param(
        "per_node_entry_budget",
        150_000,
        "per_s",
        "B.7",
        "Sustainable entries/s per MailboxNode (planning 150k).",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_connection_budget = Param(
        "per_node_connection_budget",
        200_000,
        "count",
        "B.7",
        "Connections per ConnectionNode (planning 200k).",
        per_tenant=False,
        to_be_measured=True,
    )
    partition_dispatch_budget = Param(
        "partition_dispatch_budget",
        30_000,
        "per_s",
        "B.7",
        "Dispatches/s per log partition (planning 30k).",
        per_tenant=False,
        to_be_measured=True,
    )
    compaction_ratio = Param[float | None](
        "compaction_ratio",
        None,
        "factor",
        "B.7",
        "Mean events per (user, conversation) per projection compaction window.",
        value_type=float,
        per_tenant=False,
        to_be_measured=True,
    )
    d_online = Param(
        "d_online",
        1.4,
        "factor",
        "B.7",
        "Mean online devices per online user; fixed at 1.4 throughout the text.",
        per_tenant=False,
        to_be_measured=True,
    )
    checkpoint_bytes = Param[int | None](
        "checkpoint_bytes",
        None,
        "bytes",
        "B.7",
        "Checkpoint size; with replay_rate and checkpoint_interval it determines the §19.3 RTO.",
        value_type=int,
        per_tenant=False,
        to_be_measured=True,
    )
    replay_rate = Param[float | None](
        "replay_rate",
        None,
        "per_s",
        "B.7",
        "Entries/s a MailboxNode replays from the log; feeds T_recover (§19.3.3).",
        value_type=float,
        per_tenant=False,
        to_be_measured=True,
        shares_row_with="checkpoint_bytes",
        note="Appendix B lists it in one row: 'checkpoint_bytes / replay_rate'.",
    )
    checkpoint_load_time_budget = Param(
        "checkpoint_load_time_budget",
        2 * MINUTE,
        "ms",
        "B.7",
        "Checkpoint load time, a T_recover component (§19.3.2 / §19.3.3); derivation value 2 min.",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_frame_budget = Param(
        "per_node_frame_budget",
        200_000,
        "per_s",
        "B.7",
        "Chatroom gateway outbound frames/s per node (planning 200k, §25.4).",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_syscall_budget = Param(
        "per_node_syscall_budget",
        150_000,
        "per_s",
        "B.7",
        "ConnectionNode syscalls/s (planning ≤ 150k, §25.4).",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_tls_cpu_budget = Param(
        "per_node_tls_cpu_budget",
        0.3,
        "ratio",
        "B.7",
        "Share of CPU spent on TLS (planning ≤ 30 %, §25.4).",
        per_tenant=False,
        to_be_measured=True,
    )
    per_node_pps_budget = Param(
        "per_node_pps_budget",
        PpsBudget(pps=600_000, line_rate_ratio=0.5),
        "composite",
        "B.7",
        "NIC packets/s and bandwidth share (planning, §25.4).",
        per_tenant=False,
        to_be_measured=True,
    )


class NamedInProse:
    """Defaults the chapters give a name and a value but Appendix B does not list."""

    target_utilization = Param(
        "target_utilization",
        0.5,
        "ratio",
        "prose",
        "Target utilization in the canonical shard-count lower bound (§25.6).",
        per_tenant=False,
        note="Named with its default only in §25.6 (and restated under B.7), not in a B table.",
    )
    default_history_retention_days_max = Param(
        "default_history_retention_days_max",
        3650,
        "days",
        "prose",
        "Upper bound of default_history_retention_days (ADR-0019).",
        per_tenant=False,
        minimum=1,
        note="Named only inside the B.3 row of default_history_retention_days ('1..=…(3650)').",
    )
    mailbox_write_policy = Param(
        "mailbox_write_policy",
        "always",
        "enum",
        "prose",
        "The tenant switch of the reserved read-diffusion tier (§10.2.3, §27.4): 'always' keeps "
        "every member's mailbox entry; 'mention_only' lets a group that passes the admission "
        "test switch, with hysteresis.",
        choices=("always", "mention_only"),
        note=(
            "§27.4 tenant switch, not a B row. Off by default; enabling it changes the §2.2 "
            "promise and needs ADR-0003 (I-32)."
        ),
    )
    at_all_notify_muted = Param(
        "at_all_notify_muted",
        False,
        "bool",
        "prose",
        "An @all in a muted conversation sends a system notification (§11.4.3).",
        note=(
            "§11.4.3 gives the default (a muted conversation gets no notification for AT_ALL) "
            "and says a tenant can configure it to send; the name is ours. AT_ME / REPLY_ME "
            "notify in muted conversations either way (§16.4)."
        ),
    )
