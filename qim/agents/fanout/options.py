"""The FanoutCoordinator's configuration, resolved once from ``Settings``.

Appendix B values come from ``qim.params``: the routing and event-group caps through
``FanoutConfig`` (``qim.core.fanout.config``: a replay must run with the same ones), the group's
session timeout from ``shard_lease_ttl`` (direction.md 4.1: the session is the lease of what a
member owns). Everything else is ours and documented on the field; topic names and the group id
are fields so tests can run a private pipeline next to the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from qim.core.fanout import FanoutConfig
from qim.params import Settings
from qim.streams.fetching import hot_fetch
from qim.streams.topics import DISPATCH, OUTBOX, WRITER_SNAPSHOTS

__all__ = ["GROUP_ID", "FanoutOptions"]

GROUP_ID: Final = "qim-fanout"


@dataclass(frozen=True)
class FanoutOptions:
    """Everything ``FanoutCoordinatorService`` reads; one per worker process."""

    bootstrap: str
    config: FanoutConfig = field(default_factory=FanoutConfig)
    group_id: str = GROUP_ID
    client_id: str = "qim-fanout"
    outbox_topic: str = OUTBOX.name
    dispatch_topic: str = DISPATCH.name
    snapshots_topic: str = WRITER_SNAPSHOTS.name
    """The ConversationWriter's checkpoints, read (never written) to seed membership."""
    max_records: int = 500
    """Outbox records per fetch: one produce round and one commit per partition step
    (faust-kafka-notes 7: gather the futures of a batch, never await each send)."""
    session_timeout_ms: int = 15_000
    heartbeat_interval_ms: int = 5_000
    linger_ms: int = 0
    """A fetch's dispatches are enqueued without yielding, so they batch without a linger."""
    max_held: int = 10_000
    """Held (NotReady) records per partition before its fetching pauses: a memory bound. A
    partition that reaches it stays paused until it is recovered again (a rebalance or a
    restart), which re-reads from the first held record."""
    held_report_interval_s: float = 10.0
    """How often a partition that holds records is logged again (it is counted once each)."""
    retry_s: float = 1.0
    """Backoff after a failed fetch or recovery."""

    def __post_init__(self) -> None:
        if self.max_records < 1 or self.max_held < 1:
            raise ValueError("max_records and max_held must be positive")

    @classmethod
    def from_settings(
        cls, settings: Settings, *, bootstrap: str, **overrides: Any
    ) -> FanoutOptions:
        """The production values; ``overrides`` name fields (tests, special workers)."""
        ttl = settings.shard_lease_ttl
        values: dict[str, Any] = {
            "bootstrap": bootstrap,
            "config": FanoutConfig.from_settings(settings),
            "session_timeout_ms": ttl,
            # three heartbeats per session, like the writer's renew interval (B.5.3: <= ttl / 3)
            "heartbeat_interval_ms": max(1, min(settings.writer_lease_renew_interval, ttl // 3)),
        }
        values.update(overrides)
        return cls(**values)

    def producer(self) -> AIOKafkaProducer:
        """The dispatch producer: ``acks="all"`` without idempotence (spec 6.5 / ADR-0017:
        idempotence caps the requests in flight; the MailboxNode absorbs duplicates)."""
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.client_id}-dispatch",
            acks="all",
            enable_idempotence=False,
            linger_ms=self.linger_ms,
        )

    def consumer(self) -> AIOKafkaConsumer:
        """The group member on the outbox: read_committed, commits by hand after the acks."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=self.client_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            metadata_max_age_ms=5000,
            **hot_fetch(),  # short waits: an OffsetFetch queues behind a long-polling fetch
        )
