"""The ConversationWriter's configuration, resolved once from ``Settings`` and the environment.

Appendix B values come from ``qim.params`` (the lease: ``shard_lease_ttl`` is the group's session
timeout, ``writer_lease_renew_interval`` its heartbeat interval, ``writer_self_fence_deadline``
the self-fence; admission and size limits through ``WriterConfig``). What Appendix B does not
cover is ours and documented on the fields. Environment variables beyond ``QIM_<PARAM>``:

* ``QIM_TENANT_OVERRIDES`` -- JSON ``{tenant_id: {param: value}}``, per-tenant views of the
  per-tenant parameters (rates, payload size, ...), validated like any override; the writer
  reads its limits through them (``WriterConfig.limits_for``);
* ``QIM_CUSTOM_TYPES`` -- JSON ``{tenant_id | "*": [contract, ...]}``, the tenants' spec 13.3
  custom types (every field of ``qim.schemas.message_types.CustomTypeContract``); ``"*"``
  applies to tenants without their own list; a bad declaration stops the worker at start;
* ``QIM_E2EE_DIRECT_TENANTS`` -- comma-separated tenant ids whose one-to-one conversations are
  end-to-end encrypted from their first message on (spec 22.1; ``WriterConfig``);
* ``QIM_REGION_ID`` -- the ``region_id`` field of ids (spec 6.2), 0 by default;
* ``QIM_WRITER_CHECKPOINT_EVERY`` -- outbox records between checkpoints;
* ``QIM_WRITER_LINGER_MS`` / ``QIM_WRITER_MIN_BATCH`` -- the transaction cut
  (``WriterOptions.linger_ms``, ``min_batch``; measured in ``bench/README.md`` round 4);
* ``QIM_WRITER_EARLY_OFFSETS`` (``1``/``0``) -- the offsets' round trips overlap the produce
  acknowledgements (``WriterOptions.early_offsets``; bench/README.md round 5);
* ``QIM_WRITER_TXN_RETRY_BACKOFF_MS`` -- the wait before a transaction's first
  AddPartitionsToTxn is retried after CONCURRENT_TRANSACTIONS
  (``WriterOptions.txn_retry_backoff_ms``, ``qim.streams.txn_retries``; bench/README.md round 6);
* ``QIM_WRITER_CRASH_AT`` / ``QIM_WRITER_CRASH_CMID`` -- the crash test hook (``writer_txn``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
from aiokafka.admin import AIOKafkaAdminClient

from qim.agents.writer.txn import CrashHook, Topics
from qim.core.conversation import WriterConfig
from qim.core.membership import MemberPageLimits
from qim.core.transient import TypingRules
from qim.params import Settings
from qim.schemas.hashing import validate_identifier
from qim.schemas.message_types import CustomTypeContract, decode_custom_types
from qim.streams.topics import (
    ADMIN_REPLIES,
    CONVERSATION_REQUESTS,
    DISPATCH,
    OUTBOX,
    TO_GATEWAY,
    USER_QUOTA,
    WRITER_SNAPSHOTS,
)

__all__ = [
    "GROUP_ID",
    "LINGER_MS",
    "WriterOptions",
    "custom_types",
    "describe_topics",
    "tenant_settings",
]

GROUP_ID: Final = "qim-conversation-writers"
LINGER_MS: Final = 0
"""The default of ``WriterOptions.linger_ms`` (bench/README.md round 4)."""


def tenant_settings(settings: Settings, raw: str | None) -> dict[str, Settings]:
    """Per-tenant views from ``QIM_TENANT_OVERRIDES`` (empty when unset)."""
    if not raw:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("QIM_TENANT_OVERRIDES must be a JSON object {tenant: {param: value}}")
    return {tenant: settings.for_tenant(tenant, overrides) for tenant, overrides in data.items()}


def custom_types(raw: str | None) -> Mapping[str, tuple[CustomTypeContract, ...]]:
    """The declarations of ``QIM_CUSTOM_TYPES`` (none when unset)."""
    if not raw:
        return {}
    try:
        return decode_custom_types(raw)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ValueError(f"QIM_CUSTOM_TYPES: {exc}") from exc


def e2ee_tenants(raw: str | None) -> frozenset[str]:
    """The tenant ids of ``QIM_E2EE_DIRECT_TENANTS`` (none when unset); each is validated."""
    tenants = frozenset(t.strip() for t in (raw or "").split(",") if t.strip())
    for tenant in tenants:
        validate_identifier(tenant, "QIM_E2EE_DIRECT_TENANTS tenant")
    return tenants


@dataclass(frozen=True)
class WriterOptions:
    """Everything ``ConversationWriterService`` reads; one per worker process."""

    bootstrap: str
    datadir: Path
    settings: Settings
    config: WriterConfig
    store_caps: Mapping[str, Any] = field(default_factory=dict)
    group_id: str = GROUP_ID
    client_id: str = "qim-conversation-writer"
    transactional_id_prefix: str = "qim-conversation-writer"
    """``<prefix>-<p>`` is partition p's transactional id: the fencing identity of its owner."""
    max_records: int = 500
    """Requests per fetch: one transaction per partition per fetch (faust-kafka-notes 7)."""
    checkpoint_every: int = 1000
    """Outbox records between checkpoints: bounds the replay of a takeover."""
    checkpoint_interval_s: float = 60.0
    """...or this long since the last one, if anything was appended meanwhile."""
    linger_ms: int = LINGER_MS
    """How long a partition's first fetched requests wait for more before their transaction
    starts (0: at once). A transaction costs ~5 serial broker round trips and a marker on every
    partition it wrote whatever it carries, so at low rates (one request per fetch) this trades
    up to ``linger_ms`` of SEND_ACK latency for fewer transactions. The partition keeps fetching
    while it lingers; a reply still leaves only after its commit, and fencing is unchanged."""
    min_batch: int = 500
    """...or until this many requests are gathered, whichever comes first."""
    early_offsets: bool = True
    """Request the offsets' AddOffsetsToTxn + TxnOffsetCommit while the produce
    acknowledgements are awaited (they do not depend on them; the commit still waits for every
    send). Off: after the acknowledgements, in series."""
    txn_retry_backoff_ms: int | None = None
    """aiokafka's wait before retrying a transaction's first AddPartitionsToTxn refused with
    CONCURRENT_TRANSACTIONS (the previous transaction's markers not yet written); None keeps
    aiokafka's 20 ms. Process-wide (``qim.streams.txn_retries.set_retry_backoff_ms``)."""
    restore_concurrency: int = 4
    region_id: int = 0
    crash: CrashHook = field(default_factory=CrashHook)

    requests_topic: str = CONVERSATION_REQUESTS.name
    outbox_topic: str = OUTBOX.name
    snapshots_topic: str = WRITER_SNAPSHOTS.name
    to_gateway_topic: str = TO_GATEWAY.name
    dispatch_topic: str = DISPATCH.name
    admin_replies_topic: str = ADMIN_REPLIES.name
    user_quota_topic: str = USER_QUOTA.name

    @classmethod
    def load(
        cls,
        settings: Settings,
        env: Mapping[str, str],
        *,
        bootstrap: str,
        datadir: Path,
        store_caps: Mapping[str, Any] | None = None,
    ) -> WriterOptions:
        tenants = tenant_settings(settings, env.get("QIM_TENANT_OVERRIDES"))
        return cls(
            bootstrap=bootstrap,
            datadir=datadir,
            settings=settings,
            config=WriterConfig.from_settings(
                settings,
                tenants,
                custom_types(env.get("QIM_CUSTOM_TYPES")),
                e2ee_direct_tenants=e2ee_tenants(env.get("QIM_E2EE_DIRECT_TENANTS")),
            ),
            store_caps=dict(store_caps or {}),
            checkpoint_every=int(env.get("QIM_WRITER_CHECKPOINT_EVERY", "1000")),
            linger_ms=int(env.get("QIM_WRITER_LINGER_MS", LINGER_MS)),
            min_batch=int(env.get("QIM_WRITER_MIN_BATCH", "500")),
            early_offsets=env.get("QIM_WRITER_EARLY_OFFSETS", "1") != "0",
            txn_retry_backoff_ms=_optional_int(env.get("QIM_WRITER_TXN_RETRY_BACKOFF_MS")),
            region_id=int(env.get("QIM_REGION_ID", "0")),
            crash=CrashHook.from_env(env),
        )

    def __post_init__(self) -> None:
        if self.linger_ms < 0 or self.min_batch < 1:
            raise ValueError("QIM_WRITER_LINGER_MS must be >= 0 and QIM_WRITER_MIN_BATCH >= 1")
        if self.txn_retry_backoff_ms is not None and self.txn_retry_backoff_ms < 0:
            raise ValueError("QIM_WRITER_TXN_RETRY_BACKOFF_MS must be >= 0")

    @property
    def session_timeout_ms(self) -> int:
        """The group session is the writer lease (direction.md 4.1, B.1 shard_lease_ttl)."""
        return self.settings.shard_lease_ttl

    @property
    def heartbeat_interval_ms(self) -> int:
        """Heartbeats renew the lease: B.5.3 writer_lease_renew_interval (<= ttl / 3)."""
        return self.settings.writer_lease_renew_interval

    @property
    def self_fence_deadline_ms(self) -> int:
        return self.settings.writer_self_fence_deadline

    @property
    def transaction_timeout_ms(self) -> int:
        """An open transaction holds back the last stable offset of every partition it wrote
        (to-gateway shards included): a stuck writer's is aborted after one lease."""
        return self.settings.shard_lease_ttl

    @property
    def member_limits(self) -> MemberPageLimits:
        return MemberPageLimits.from_settings(self.settings)

    @property
    def max_members(self) -> int:
        return self.settings.max_members_per_group

    @property
    def e2ee_max_members(self) -> int:
        return int(self.settings.e2ee_max_members)

    @property
    def mailbox_shard_count(self) -> int:
        return self.settings.mailbox_shard_count

    @property
    def virtual_bucket_count(self) -> int:
        return int(self.settings.virtual_bucket_count)

    @property
    def typing_rules(self) -> TypingRules:
        """13.2's B.6.1 rows (global: the writer has no per-tenant view of them yet)."""
        s = self.settings
        return TypingRules(
            merge_window_ms=int(s.typing_merge_window),
            ttl_ms=int(s.typing_ttl),
            large_group_member_threshold=int(s.large_group_member_threshold),
        )

    def transactional_id(self, partition: int) -> str:
        return f"{self.transactional_id_prefix}-{partition}"

    def store_path(self, partition: int) -> Path:
        """One MessageStore per writer partition under the worker's datadir."""
        return self.datadir / "message-store" / f"p{partition}"


async def describe_topics(options: WriterOptions) -> tuple[Topics, int]:
    """The topics a transaction writes, and the partition count of the requests topic.

    Counts come from the broker, not from configuration: the to-gateway count bounds a reply's
    ConnectionShard, the requests count is the ``conversation_partition`` modulus.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=options.bootstrap)
    await admin.start()
    try:
        names = [options.requests_topic, options.to_gateway_topic]
        counts = {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(names)}
    finally:
        await admin.close()
    topics = Topics(
        requests=options.requests_topic,
        outbox=options.outbox_topic,
        snapshots=options.snapshots_topic,
        to_gateway=options.to_gateway_topic,
        dispatch=options.dispatch_topic,
        admin_replies=options.admin_replies_topic,
        to_gateway_partitions=counts[options.to_gateway_topic],
    )
    return topics, counts[options.requests_topic]


def _optional_int(raw: str | None) -> int | None:
    return None if raw is None or raw == "" else int(raw)
