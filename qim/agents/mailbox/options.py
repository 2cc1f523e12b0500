"""The MailboxNode's configuration, resolved once from ``Settings`` and the environment.

Appendix B values come from ``qim.params`` (``shard_lease_ttl`` is the group's session timeout,
retention, entry cap, pull limits, ``max_frame_bytes``). What Appendix B does not cover is ours,
documented on the fields. Environment variables beyond ``QIM_<PARAM>``:

* ``QIM_MAILBOX_SHARD_EPOCH`` -- the ``shard_epoch`` of every shard (default 1). Raised only
  when dispatch offsets are invalidated (direction.md 4.5); the store records the epoch it was
  built with and refuses to fold a lower one;
* ``QIM_CURSOR_KEYS`` -- the MailboxCursor HMAC ring ``"kid:base64secret,..."``, first key signs;
  otherwise the development ring in ``QIM_CURSOR_KEYS_FILE`` (default ``<repo>/.run/cursor-keys``),
  created with one random key on first use. Every MailboxNode must load the same ring;
* ``QIM_TENANT_OVERRIDES`` -- per-tenant ``mailbox_retention_days`` and ``at_all_notify_muted``
  (as for the writer);
* ``QIM_MAILBOX_SWEEP_INTERVAL_S`` -- how often the retention sweep runs (default 60);
* ``QIM_MAILBOX_RECONCILE_INTERVAL_S`` -- how often each owned shard's presence cache is
  reconciled against a full read of its compacted partition (default 60, spec 5.4.3 (2); 0: off);
* ``QIM_MAILBOX_MAX_RECORDS`` -- records per fetch and per materialize call (default 500);
* ``QIM_MAILBOX_CHECKPOINT_DIR`` -- where shard checkpoints are shipped (19.3.1's object
  storage: a directory every MailboxNode mounts); unset: no checkpoints, a takeover on an empty
  disk replays the whole dispatch partition. Interval: Appendix B ``checkpoint_interval``;
* ``QIM_MAILBOX_CHECKPOINT_KEEP`` -- checkpoints kept per shard (default 2);
* ``QIM_MAILBOX_TOMBSTONE_PROBE`` -- ``0`` stops measuring ``tombstones_scanned`` per request
  (default ``1``; reading RocksDB's statistics costs ~0.3 ms twice per request);
* ``QIM_MAILBOX_CRASH_AT`` / ``_CRASH_SHARD`` / ``_CRASH_OFFSET`` -- the crash test hook.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from qim.agents.writer.options import tenant_settings
from qim.core.mailbox import FIRST_SHARD_EPOCH, MailboxConfig
from qim.core.sync import CursorKey, CursorKeyRing, PullLimits
from qim.params import Settings
from qim.schemas.seqs import MAX_EPOCH
from qim.streams.fetching import hot_fetch
from qim.streams.topics import (
    DISPATCH,
    PRESENCE,
    TO_GATEWAY,
    USER_CONVERSATION_STATE_CHANGELOG,
    USER_QUOTA,
    USER_REQUESTS,
)

__all__ = [
    "CRASH_STEPS",
    "DEFAULT_CURSOR_KEYS_PATH",
    "GROUP_ID",
    "KAFKA_RECORD_BUDGET",
    "CrashHook",
    "MailboxOptions",
    "load_cursor_keys",
]

GROUP_ID: Final = "qim-mailbox-nodes"
"""Not the app id ``qim-mailbox``: Faust's own worker consumer already joins that group with its
own assignor protocol, and a member with another protocol would be refused by the coordinator."""

CRASH_STEPS: Final = ("committed", "written", "ustate")
DEFAULT_CURSOR_KEYS_PATH: Final = Path(__file__).resolve().parents[2] / ".run" / "cursor-keys"
KAFKA_RECORD_BUDGET: Final = 1_000_000
"""A reply is one Kafka record: the broker's default ``message.max.bytes`` (1 MiB) caps a
MAILBOX_BATCH below B.5's ``max_frame_bytes`` (4 MiB); the cutter keeps it under this."""


@dataclass(frozen=True, slots=True)
class CrashHook:
    """Kill -9 this process at ``step`` of the batch of ``shard`` holding ``offset`` (tests).

    ``committed``: the dispatch offsets (and published floor) were committed, the WriteBatch
    was not written -- the "commit, then materialize" order spec 10.4.2 (1) warns about (M-2).
    ``written``: the WriteBatch is durable, nothing was committed.
    ``ustate``: the WriteBatch changed ``U`` rows and is durable, its UserConversationState
    changelog records were not produced (decision 41); only a batch that changed rows arms it.
    """

    step: str | None = None
    shard: int = -1
    offset: int = -1

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CrashHook:
        step = env.get("QIM_MAILBOX_CRASH_AT") or None
        if step is not None and step not in CRASH_STEPS:
            raise ValueError(f"QIM_MAILBOX_CRASH_AT must be one of {CRASH_STEPS}")
        return cls(
            step,
            int(env.get("QIM_MAILBOX_CRASH_SHARD", "-1")),
            int(env.get("QIM_MAILBOX_CRASH_OFFSET", "-1")),
        )

    def armed(self, step: str, shard: int, first_offset: int, last_offset: int) -> bool:
        return (
            self.step == step and self.shard == shard and first_offset <= self.offset <= last_offset
        )

    @staticmethod
    def crash() -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def _parse_ring(spec: str) -> CursorKeyRing:
    keys = []
    for item in spec.split(","):
        kid, sep, secret = item.strip().partition(":")
        if not sep:
            raise ValueError("cursor keys are 'kid:base64secret' separated by commas")
        keys.append(CursorKey(kid, base64.b64decode(secret, validate=True)))
    return CursorKeyRing(keys)


def load_cursor_keys(env: Mapping[str, str], dev_path: Path | None = None) -> CursorKeyRing:
    """``QIM_CURSOR_KEYS``, else the dev ring file (created atomically on first use)."""
    spec = env.get("QIM_CURSOR_KEYS", "").strip()
    if spec:
        return _parse_ring(spec)
    if dev_path is None:
        override = env.get("QIM_CURSOR_KEYS_FILE", "").strip()
        dev_path = Path(override) if override else DEFAULT_CURSOR_KEYS_PATH
    if not dev_path.exists():
        dev_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = dev_path.with_name(f".{dev_path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(f"dev1:{base64.b64encode(secrets.token_bytes(32)).decode()}\n")
            with contextlib.suppress(FileExistsError):  # a concurrent first start won: keep its
                os.link(tmp, dev_path)
        finally:
            tmp.unlink(missing_ok=True)
    return _parse_ring(dev_path.read_text().strip())


@dataclass(frozen=True)
class MailboxOptions:
    """Everything ``MailboxNodeService`` reads; one per worker process."""

    bootstrap: str
    datadir: Path
    settings: Settings
    cursor_keys: CursorKeyRing
    shard_epoch: int = FIRST_SHARD_EPOCH
    tenant_retention_days: Mapping[str, int] = field(default_factory=dict)
    tenant_at_all_notify_muted: Mapping[str, bool] = field(default_factory=dict)
    """Per-tenant ``at_all_notify_muted`` (11.4.3); others read ``settings``."""
    store_caps: Mapping[str, Any] = field(default_factory=dict)
    group_id: str = GROUP_ID
    client_id: str = "qim-mailbox-node"
    max_records: int = 500
    """Records per fetch, and per materialize call (one WriteBatch). A single dispatch is never
    split: a 100k-member group's entries commit in one batch, beyond
    ``mailbox_writebatch_max_entries`` (atomicity of one dispatch comes first, I-12)."""
    sweep_interval_s: float = 60.0
    retry_after_ms: int = 1000
    """``SHARD_MOVED.retry_after_ms`` while a lane catches up after a takeover."""
    crash: CrashHook = field(default_factory=CrashHook)
    dispatch_topic: str = DISPATCH.name
    requests_topic: str = USER_REQUESTS.name
    to_gateway_topic: str = TO_GATEWAY.name
    presence_topic: str = PRESENCE.name
    user_quota_topic: str = USER_QUOTA.name
    reconcile_interval_s: float = 60.0
    """Presence reconcile period (5.4.3 (2)); 0 turns it off."""
    tombstone_probe: bool = True
    """Measure ``tombstones_scanned`` for every request (the 26.0 observation point)."""
    checkpoint_dir: Path | None = None
    """Shipped checkpoints (:mod:`qim.tables.mailbox_checkpoint`); None: none taken."""
    checkpoint_keep: int = 2

    def __post_init__(self) -> None:
        if not FIRST_SHARD_EPOCH <= self.shard_epoch <= MAX_EPOCH:
            raise ValueError(f"shard_epoch must be in [{FIRST_SHARD_EPOCH}, {MAX_EPOCH}]")

    @classmethod
    def load(
        cls,
        settings: Settings,
        env: Mapping[str, str],
        *,
        bootstrap: str,
        datadir: Path,
        store_caps: Mapping[str, Any] | None = None,
    ) -> MailboxOptions:
        tenants = tenant_settings(settings, env.get("QIM_TENANT_OVERRIDES"))
        return cls(
            bootstrap=bootstrap,
            datadir=datadir,
            settings=settings,
            cursor_keys=load_cursor_keys(env),
            shard_epoch=int(env.get("QIM_MAILBOX_SHARD_EPOCH", str(FIRST_SHARD_EPOCH))),
            tenant_retention_days={t: s.mailbox_retention_days for t, s in tenants.items()},
            tenant_at_all_notify_muted={t: s.at_all_notify_muted for t, s in tenants.items()},
            store_caps=dict(store_caps or {}),
            max_records=int(env.get("QIM_MAILBOX_MAX_RECORDS", "500")),
            sweep_interval_s=float(env.get("QIM_MAILBOX_SWEEP_INTERVAL_S", "60")),
            reconcile_interval_s=float(env.get("QIM_MAILBOX_RECONCILE_INTERVAL_S", "60")),
            tombstone_probe=env.get("QIM_MAILBOX_TOMBSTONE_PROBE", "1") != "0",
            checkpoint_dir=Path(ckpt) if (ckpt := env.get("QIM_MAILBOX_CHECKPOINT_DIR")) else None,
            checkpoint_keep=int(env.get("QIM_MAILBOX_CHECKPOINT_KEEP", "2")),
            crash=CrashHook.from_env(env),
        )

    def at_all_notify_muted(self, tenant_id: str) -> bool:
        """11.4.3: whether an @all in a muted conversation of ``tenant_id`` notifies."""
        return self.tenant_at_all_notify_muted.get(tenant_id, self.settings.at_all_notify_muted)

    def config(self, shard: int) -> MailboxConfig:
        return MailboxConfig.from_settings(
            self.settings, shard, tenant_retention_days=self.tenant_retention_days
        )

    @property
    def limits(self) -> PullLimits:
        base = PullLimits.from_settings(self.settings)
        frame = min(base.max_frame_bytes, KAFKA_RECORD_BUDGET)
        return PullLimits(base.max_items, min(base.max_bytes, frame), frame)

    @property
    def session_timeout_ms(self) -> int:
        """The group session is the shard lease (direction.md 4.1, B.1 shard_lease_ttl)."""
        return self.settings.shard_lease_ttl

    @property
    def heartbeat_interval_ms(self) -> int:
        return max(self.settings.shard_lease_ttl // 3, 100)

    def consumer(self, assignor: type) -> AIOKafkaConsumer:
        """The group member: dispatch + user-requests, manual commits, the lease as session."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=self.client_id,
            enable_auto_commit=False,
            # The writer's member slices ride its transactions: an aborted (zombie) slice must
            # never be folded, so the dispatch log is read at the last stable offset.
            isolation_level="read_committed",
            auto_offset_reset="earliest",  # only reached when the seek target left retention
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            partition_assignment_strategy=(assignor,),
            metadata_max_age_ms=5000,
            **hot_fetch(),
        )

    def presence_reader(self) -> AIOKafkaConsumer:
        """A group-less consumer for the reconcile's full reads (manually assigned)."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            client_id=f"{self.client_id}-reconcile",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )

    @property
    def ucs_changelog_topic(self) -> str:
        return USER_CONVERSATION_STATE_CHANGELOG.name

    def reply_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=2, client_id=self.client_id
        )

    @property
    def checkpoint_interval_s(self) -> float:
        """Appendix B.5.3 ``checkpoint_interval`` (ms) in seconds."""
        return self.settings.checkpoint_interval / 1000.0

    def checkpoint_staging(self, shard: int) -> Path:
        """The local checkpoint (hard links on the store's filesystem) before it is shipped."""
        return self.datadir / "mailbox-checkpoints" / f"shard-{shard}"

    def store_path(self, shard: int) -> Path:
        """One RocksDB per owned MailboxShard under the worker's datadir."""
        return self.datadir / "mailbox" / f"shard-{shard}"
