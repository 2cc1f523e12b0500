"""The MailboxNode's offline push step: PushTasks for offline devices after the WriteBatch.

Same order as the online push (11.1.2 / 16.1.1 "materialize first, then push"): called after
the fold's WriteBatch is durable, with entries read back from the committed store and the
badge numbers of the user's UserBadgeState the fold wrote (so a push's badge is the one
BADGE_UPDATE carries, 16.3). The per-device decision is :func:`qim.core.notify.tasks.
plan_push_tasks`; records go to ``qim.push-tasks`` at the user's mailbox shard partition,
fire-and-forget (a lost PushTask is a missed wake-up, never a lost message, 16.9).

D(user) comes from :class:`DigestFollower`, the node's local cache of the compacted
``device_token_digest`` topic (16.6; the DeviceToken table itself is never read, 17.3). It
reads every partition (the topic's declared count, ``mailbox_shard_count``) from the beginning
with its own manually assigned consumer (no group):
a digest record is a few bytes per device, and following all partitions keeps it independent
of the shard assignment (a deliberate simplification of "partitioned by the same
user_bucket"; a node at scale would follow only its owned partitions like presence).
``device_token_digest_lag`` (24.1.6) is the age of the oldest record not yet applied, 0 when
caught up.

The second check (16.1.2, :class:`OnlineChecks`): the alert tasks the planner makes for
*online* wakeable devices are held per owned shard in a
:class:`~qim.core.notify.second_check.SecondCheck`, fed by the gateway's PushEvidence and
CONN_CLOSED records on ``qim.user-requests`` and ticked by the node
(``second_check_tick_ms``); what comes due goes out like an offline device's task, with the
badge numbers re-read from the committed UserBadgeState at that moment (16.3: the push's badge
is the one BADGE_UPDATE carries now, not the one of the fold that held it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from qim.core.mailbox import MailboxReader, WrittenGroup
from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import is_e2ee_message, load_header, load_state
from qim.core.mailbox.sessions import SessionChange
from qim.core.notify.second_check import SecondCheck
from qim.core.notify.tasks import Badge, DigestCache, UserFold, plan_device_tasks, push_policy
from qim.core.push import ShardPresenceCache
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.notify import DeviceKey, PushTask, decode_digest, encode
from qim.schemas.records.push import ConnClosed, PushEvidence
from qim.schemas.records.user_requests import decode_user_request
from qim.schemas.seqs import split_mailbox_seq

__all__ = [
    "CATCH_UP_MAX",
    "DigestFollower",
    "OfflinePush",
    "OnlineChecks",
    "catch_up_tasks",
    "user_folds",
    "with_current_badge",
]

log = logging.getLogger(__name__)


class DigestFollower:
    """Follows ``device_token_digest`` into a :class:`DigestCache` in a background task."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, registry: CollectorRegistry
    ) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.cache = DigestCache()
        self._task: asyncio.Task[None] | None = None
        self._oldest_pending_ms = 0
        self.lag = Gauge(
            "device_token_digest_lag",
            "Seconds the MailboxNode's digest cache is behind the device_token_digest end "
            "(24.1.6; 0 when caught up).",
            registry=registry,
        )
        self.lag.set_function(self._lag_s)
        self.malformed = Counter(
            "device_token_digest_malformed",
            "device_token_digest records that did not decode (skipped).",
            registry=registry,
        )

    def _lag_s(self) -> float:
        pending = self._oldest_pending_ms
        return 0.0 if not pending else max(0.0, time.time() - pending / 1000.0)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None
            )
            try:
                await consumer.start()
                tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                while True:
                    fetched = await consumer.getmany(timeout_ms=500, max_records=2000)
                    for records in fetched.values():
                        for record in records:
                            self._apply(record.key, record.value)
                    self._oldest_pending_ms = 0
                    for tp in tps:
                        hw = consumer.highwater(tp)
                        if hw is not None and await consumer.position(tp) < hw:
                            self._oldest_pending_ms = int(time.time() * 1000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("device_token_digest follower failed; restarting from the start")
                self.cache = DigestCache()
                await asyncio.sleep(1.0)
            finally:
                await consumer.stop()

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        try:
            if key is None:
                raise ValueError("no key")
            self.cache.apply(DeviceKey.decode(key), decode_digest(value))
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError, AssertionError):
            self.malformed.inc()


def user_folds(
    written: Sequence[WrittenGroup],
    sessions: Sequence[SessionChange],
    *,
    reader: MailboxReader,
    store: KVReader,
    push_from_offset: int,
    wakeable: Callable[[str, str], bool],
    at_all_notify_muted: Callable[[str], bool] = lambda _tenant_id: False,
) -> list[UserFold]:
    """Per user of the fold with a registered device (``wakeable``, checked first so a fold
    of users without push tokens reads nothing more): its new entries (read back from the
    committed store), its badge, and the 16.4 push policy of each entry's conversation (the
    user's UserConversationState ``muted`` / ``notification_policy`` as committed, and the
    tenant's ``at_all_notify_muted``, 11.4.3), and which of those conversations are
    end-to-end encrypted (the message facts' flag, 16.7)."""
    entries: dict[tuple[str, str], list[SyncEntry]] = {}
    for group in sorted(written, key=lambda g: (g.tenant_id, g.user_id, g.mailbox_seq)):
        if split_mailbox_seq(group.mailbox_seq).log_offset < push_from_offset:
            continue  # replay below the takeover point: the previous owner pushed it
        if not wakeable(group.tenant_id, group.user_id):
            continue
        rows = entries.setdefault((group.tenant_id, group.user_id), [])
        for _, found in reader.read_user_range(
            group.tenant_id, group.user_id, group.mailbox_seq - 1, group.mailbox_seq
        ):
            rows.extend(found)
    changed = {
        (c.tenant_id, c.user_id)
        for c in sessions
        if c.badge_changed and wakeable(c.tenant_id, c.user_id)
    }
    return [
        _fold_of(
            store,
            tenant,
            user,
            entries.get((tenant, user), []),
            badge_changed=(tenant, user) in changed,
            at_all_notify_muted=at_all_notify_muted(tenant),
        )
        for tenant, user in sorted(set(entries) | changed)
    ]


def _fold_of(
    store: KVReader,
    tenant: str,
    user: str,
    mine: Sequence[SyncEntry],
    *,
    badge_changed: bool,
    at_all_notify_muted: bool,
) -> UserFold:
    """One user's :class:`UserFold` of these entries, read from the committed store."""
    b = load_header(store, tenant, user).badge
    policies = []
    for conversation_id in sorted({e.conversation_id for e in mine}):
        state = load_state(store, tenant, user, conversation_id)
        policy = push_policy(
            state.muted, state.notification_policy, at_all_notify_muted=at_all_notify_muted
        )
        if policy != "ALL":
            policies.append((conversation_id, policy))
    return UserFold(
        tenant_id=tenant,
        user_id=user,
        entries=tuple(mine),
        badge=Badge(
            b.total_unread, b.total_mention, b.muted_unread, b.badge_projection_mailbox_seq
        ),
        badge_changed=badge_changed,
        policies=tuple(policies),
        e2ee=tuple(
            sorted(
                {
                    e.conversation_id
                    for e in mine
                    if is_e2ee_message(store, tenant, e.conversation_id, e.conversation_seq)
                }
            )
        ),
    )


CATCH_UP_MAX: Final = 50
"""The newest entries of a CONN_CLOSED range that get a PushTask (``nse_pull_max_items``: the
notification extension pulls at most that many anyway; the NotificationService merges)."""


def catch_up_tasks(
    closed: ConnClosed,
    *,
    reader: MailboxReader,
    store: KVReader,
    digests: DigestCache,
    at_all_notify_muted: bool,
    skip: frozenset[str] = frozenset(),
) -> list[PushTask]:
    """16.1.2's catch-all: the alert tasks of the closed device for its entries in (latest
    APPLIED, ``last_pushed_user_seq``], read from the committed store, as for an offline
    device (mute and E2EE rules included). The floor is also the login's ``sync_to_seq``:
    what the login pull delivered was not pushed. ``skip``: event ids already released."""
    after = max(closed.applied_seq, closed.sync_to_seq)
    if closed.last_pushed_user_seq <= after:
        return []
    tenant, user = closed.tenant_id, closed.user_id
    rows: list[SyncEntry] = []
    for _, found in reader.read_user_range(tenant, user, after, closed.last_pushed_user_seq):
        rows.extend(found)
    fold = _fold_of(
        store,
        tenant,
        user,
        rows[-CATCH_UP_MAX:],
        badge_changed=False,
        at_all_notify_muted=at_all_notify_muted,
    )
    tasks, _ = plan_device_tasks([fold], digests=digests, online={})
    return [
        t
        for t in tasks
        if t.device_id == closed.device_id and t.kind == "alert" and t.event_id not in skip
    ]


class OfflinePush:
    """Plans and enqueues PushTasks for one fold; never raises into the fold."""

    def __init__(self, topic: str, follower: DigestFollower, registry: CollectorRegistry) -> None:
        self.topic, self.follower = topic, follower
        self.tasks = Counter(
            "push_task_count",
            "PushTasks the MailboxNode emitted for offline devices (26.5), by kind.",
            ["kind"],
            registry=registry,
        )
        self.skipped = Counter(
            "push_task_skipped",
            "Folds whose offline push was not planned, by reason.",
            ["reason"],
            registry=registry,
        )

    def plan(
        self,
        folds: Sequence[UserFold],
        presence: ShardPresenceCache | None,
        now_ms: int,
    ) -> tuple[list[PushTask], list[PushTask]]:
        """``(send now, hold for the second check)`` (:func:`plan_device_tasks`)."""
        if not folds:
            return [], []
        if presence is None:  # the cache is rebuilding: no decision from half a cache
            self.skipped.labels("presence_rebuilding").inc()
            return [], []
        online = {
            (f.tenant_id, f.user_id): [
                d.device_id for d in presence.devices(f.tenant_id, f.user_id, now_ms)
            ]
            for f in folds
        }
        return plan_device_tasks(folds, digests=self.follower.cache, online=online)

    async def send(
        self,
        producer: AIOKafkaProducer,
        tasks: Sequence[PushTask],
        *,
        mailbox_shard: int,
        background: set[asyncio.Task[None]],
    ) -> None:
        futures = []
        for task in tasks:
            key = DeviceKey(task.tenant_id, task.user_id, task.device_id)
            try:
                futures.append(
                    await producer.send(
                        self.topic, encode(task), key=key.encode(), partition=mailbox_shard
                    )
                )
                self.tasks.labels(task.kind).inc()
            except Exception:
                log.exception("PushTask for shard %d not sent", mailbox_shard)
        if futures:
            gathered = asyncio.ensure_future(asyncio.gather(*futures, return_exceptions=True))

            async def wait() -> None:
                outcomes = await gathered
                failed = sum(isinstance(o, BaseException) for o in outcomes)
                if failed:
                    log.warning("%d PushTask(s) not acknowledged", failed)

            t = asyncio.ensure_future(wait())
            background.add(t)
            t.add_done_callback(background.discard)


class OnlineChecks:
    """The owned shards' :class:`SecondCheck` s and the records that feed them (module doc)."""

    def __init__(self, *, grace_ms: int, extended_ms: int, tick_ms: int,
                 registry: CollectorRegistry) -> None:  # fmt: skip
        self.grace_ms, self.extended_ms, self.tick_ms = grace_ms, extended_ms, tick_ms
        self.shards: dict[int, SecondCheck] = {}
        self._dormant: dict[int, SecondCheck] = {}  # revoked, kept for a re-assignment
        self.outcomes = Counter(
            "push_second_check",
            "The MailboxNode's second check for online devices (16.1.2), by outcome: held "
            "(an alert task awaiting evidence), expired (pushed: the window passed without "
            "APPLIED), delivered (dropped at the extended window: the peer's TCP acknowledged "
            "the frame, the connection is alive), conn_closed (pushed at CONN_CLOSED), "
            "conn_closed_range (pushed at CONN_CLOSED from the store: entries in (APPLIED, "
            "last_pushed_user_seq] no held task covered), "
            "superseded (held tasks of a device whose closed session has a newer live one: "
            "not pushed at the close, they keep their windows).",
            ["outcome"],
            registry=registry,
        )
        self.held_gauge = Gauge(
            "push_second_check_pending",
            "Alert tasks the MailboxNode holds for online devices awaiting evidence (16.1.2).",
            registry=registry,
        )
        self.held_gauge.set_function(lambda: sum(len(c) for c in self.shards.values()))

    def assign(self, shards: Iterable[int], now_ms: int) -> None:
        """A new assignment: the kept shards keep their checks, new ones start empty."""
        wanted = set(shards)
        kept = {**self._dormant, **self.shards}
        self._dormant = {}
        self.shards = {
            p: kept.get(p)
            or SecondCheck(
                grace_ms=self.grace_ms,
                extended_ms=self.extended_ms,
                tick_ms=self.tick_ms,
                now_ms=now_ms,
            )
            for p in sorted(wanted)
        }

    def clear(self) -> None:
        """Revoked: no evidence is read and nothing comes due until the next assignment,
        which keeps the checks of the shards it gives back (an eager rebalance revokes all)."""
        self._dormant.update(self.shards)
        self.shards = {}

    def hold(self, shard: int, tasks: Sequence[PushTask], now_ms: int) -> None:
        check = self.shards.get(shard)
        if check is None or not tasks:
            return
        check.hold(tasks, now_ms)
        self.outcomes.labels("held").inc(len(tasks))

    def apply(
        self,
        shard: int,
        records: Iterable[Any],
        presence: ShardPresenceCache | None,
        now_ms: int,
    ) -> tuple[list[PushTask], list[ConnClosed]]:
        """The PushEvidence / CONN_CLOSED records of a user-requests run; returns the tasks
        the closes released and the closes themselves (the caller reads their ranges, 16.1.2
        catch-all); other kinds are skipped."""
        check = self.shards.get(shard)
        if check is None:
            return [], []
        out: list[PushTask] = []
        closes: list[ConnClosed] = []
        for record in records:
            try:
                request = decode_user_request(record.value)
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
                continue
            if isinstance(request, PushEvidence):
                for d in request.devices:
                    ref = (request.tenant_id, d.user_id, d.device_id)
                    check.evidence(
                        ref,
                        pushed_seq=d.pushed_seq,
                        applied_seq=d.applied_seq,
                        delivered_seq=d.delivered_seq,
                    )
            elif isinstance(request, ConnClosed):
                ref = (request.tenant_id, request.user_id, request.device_id)
                if _newer_session_live(presence, request, now_ms):
                    if check.pending(ref):
                        self.outcomes.labels("superseded").inc(len(check.pending(ref)))
                    check.evidence(ref, pushed_seq=0, applied_seq=request.applied_seq)
                    continue  # the newer session's login sync delivers; its own timers run
                released = check.closed(ref, applied_seq=request.applied_seq)
                self.outcomes.labels("conn_closed").inc(len(released))
                out.extend(released)
                closes.append(request)
        return out, closes

    def due(self, now_ms: int) -> dict[int, list[PushTask]]:
        """Per shard, the tasks whose window passed without APPLIED evidence."""
        out = {}
        for p, check in sorted(self.shards.items()):
            alive = check.confirmed_alive
            tasks = check.advance(now_ms)
            if check.confirmed_alive > alive:
                self.outcomes.labels("delivered").inc(check.confirmed_alive - alive)
            if tasks:
                self.outcomes.labels("expired").inc(len(tasks))
                out[p] = tasks
        return out


def _newer_session_live(
    presence: ShardPresenceCache | None, closed: ConnClosed, now_ms: int
) -> bool:
    if presence is None:
        return False
    return any(
        d.device_id == closed.device_id and d.session_epoch > closed.session_epoch
        for d in presence.devices(closed.tenant_id, closed.user_id, now_ms)
    )


def with_current_badge(store: KVReader, tasks: Sequence[PushTask]) -> list[PushTask]:
    """The tasks with the badge numbers of the user's UserBadgeState as committed now."""
    out = []
    for task in tasks:
        b = load_header(store, task.tenant_id, task.user_id).badge
        out.append(
            msgspec.structs.replace(
                task,
                total_unread=b.total_unread,
                total_mention=b.total_mention,
                muted_unread=b.muted_unread,
                badge_projection_mailbox_seq=b.badge_projection_mailbox_seq,
            )
        )
    return out
