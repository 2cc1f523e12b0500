"""ConnectionShard ownership through Kafka's group protocol (direction.md 4.1, spec 5.2-5.3).

Every ConnectionNode is a member of one consumer group on the to-gateway topic. The partitions a
member holds ARE the ConnectionShards it owns, and the group session is the shard lease
(`shard_lease_ttl`, Appendix B.1, 15 s). There is no second registry: where another shard's
owner can be reached (the REDIRECT `endpoint_hint`) travels inside the same protocol, through a
custom partition assignor:

* each member advertises its endpoints (and the shards it held) in its JoinGroup metadata;
* the leader assigns shards (balanced, sticky) and writes the full owner map
  shard -> endpoints into every member's SyncGroup assignment, so after each rebalance every
  member knows the owner of every shard.

The pure parts (algorithm, encodings, lease arithmetic) live in `ownership_assignor`.

Ownership changes only at rebalance boundaries, with two refinements:

* while a rebalance runs nobody owns anything: aiokafka's protocol is eager, every member gives
  up all its partitions before rejoining, and which ones come back is known only at the end;
* between rebalances the member stops owning once its session may have expired (no successful
  heartbeat for `session_timeout - lease_margin`), so a gateway cut off from the coordinator
  stops serving before the group hands its shards to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

from aiokafka import AIOKafkaConsumer
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from qim.gateway.ownership.assignor import (
    EMPTY_CLAIM,
    Endpoints,
    Lease,
    MemberClaim,
    OwnerMap,
    assign_partitions,
    decode_member_metadata,
    decode_owner_map,
    encode_member_metadata,
    encode_owner_map,
    next_seq,
)
from qim.streams.fetching import hot_fetch
from qim.streams.topics import TO_GATEWAY

log = logging.getLogger(__name__)

ASSIGNOR_NAME = "qim-connection-shard"
ASSIGNOR_VERSION = 1
DEFAULT_GROUP_ID = "qim-gateways"
DEFAULT_SESSION_TIMEOUT_MS = 15_000  # Appendix B.1 shard_lease_ttl
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000  # a fifth of the session, the usual Kafka ratio

ShardCallback = Callable[[set[int]], Awaitable[None] | None]


class ShardRecord(NamedTuple):
    """One record of an owned to-gateway partition; `partition` is the connection_shard_id."""

    partition: int
    key: bytes | None
    value: bytes | None


class AssignorBinding:
    """The per-member state behind the assignor: aiokafka calls assignors through classmethods,
    so each ShardOwnership binds one of these to its own assignor subclass (`bound_assignor`)."""

    def __init__(self, topic: str, endpoints: Endpoints) -> None:
        self.topic = topic
        self.endpoints = endpoints
        # What this member claims at its next JoinGroup: the last assignment it received.
        self.claim_seq = 0
        self.claim_owned: tuple[int, ...] = ()
        self.received_map: OwnerMap | None = None

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        claim = MemberClaim(self.endpoints, self.claim_seq, self.claim_owned)
        return ConsumerProtocolMemberMetadata(
            ASSIGNOR_VERSION, sorted(topics), encode_member_metadata(claim)
        )

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """Leader only: decide the owners and publish the owner map to every member."""
        partitions = cluster.partitions_for_topic(self.topic) or set()
        count = max(partitions) + 1 if partitions else 0
        claims: dict[str, MemberClaim] = {}
        for member_id, meta in members.items():
            if self.topic not in meta.subscription:
                continue
            claim = decode_member_metadata(meta.user_data or b"")
            if claim is None:
                log.warning("member %s sent unreadable ownership metadata", member_id)
            claims[member_id] = claim or EMPTY_CLAIM
        seq = next_seq(claims.values())
        assignment = assign_partitions(count, claims)
        owner_map = OwnerMap.from_assignment(
            seq, count, assignment, {m: c.endpoints for m, c in claims.items()}
        )
        user_data = encode_owner_map(owner_map)
        log.info(
            "assigned %d ConnectionShards of %s to %d members, seq=%d",
            count,
            self.topic,
            len(claims),
            seq,
        )
        result: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member_id in sorted(members):
            parts = list(assignment.get(member_id, ()))
            topics = [(self.topic, parts)] if parts else []
            result[member_id] = ConsumerProtocolMemberAssignment(
                ASSIGNOR_VERSION, topics, user_data
            )
        return result

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Every member: remember the owner map and what to claim at the next join."""
        own = sorted({tp.partition for tp in assignment.partitions() if tp.topic == self.topic})
        owner_map = decode_owner_map(assignment.user_data or b"")
        if owner_map is None:
            log.warning("assignment carried no readable owner map; only own shards are known")
        else:
            self.claim_seq = owner_map.seq
            mapped = owner_map.partitions_of(self.endpoints)
            if not mapped.issuperset(own):
                log.warning("owner map disagrees with own assignment: %s", owner_map)
        self.claim_owned = tuple(own)
        self.received_map = owner_map


class ShardOwnerAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka partition assignor that delegates to a bound `AssignorBinding`."""

    name = ASSIGNOR_NAME
    version = ASSIGNOR_VERSION
    binding: ClassVar[AssignorBinding]

    @classmethod
    def assign(
        cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        return cls.binding.assign(cluster, members)

    @classmethod
    def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return cls.binding.metadata(topics)

    @classmethod
    def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
        cls.binding.on_assignment(assignment)


def bound_assignor(binding: AssignorBinding) -> type[ShardOwnerAssignor]:
    """A subclass per member: the class is what aiokafka calls, the binding is the state."""

    class BoundShardOwnerAssignor(ShardOwnerAssignor):
        pass

    BoundShardOwnerAssignor.binding = binding
    return BoundShardOwnerAssignor


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, ownership: ShardOwnership) -> None:
        self._ownership = ownership

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._ownership._group_revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._ownership._resolve_positions(assigned)
        self._ownership._group_assigned(assigned)


class ShardOwnership:
    """Which ConnectionShards this gateway owns, and who owns the others.

    `owns(shard)` is the admission check (AUTH, REDIRECT decisions); `owner_endpoint(shard)` is
    the REDIRECT `endpoint_hint` (the last map received, also during a rebalance; it may name
    this gateway while it does not own the shard: answer SHARD_MOVED then). `on_assigned` and
    `on_revoked` receive the shards gained and lost, in order, from a task of their own (a slow
    KICK does not delay heartbeats). `records()` yields batches of the owned partitions.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        endpoint: str,
        *,
        tls_endpoint: str | None = None,
        topic: str = TO_GATEWAY.name,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        lease_margin_ms: int | None = None,
        on_assigned: ShardCallback | None = None,
        on_revoked: ShardCallback | None = None,
        client_id: str = "qim-gateway",
        poll_timeout_ms: int = 500,
        max_records: int = 500,
        record_buffer: int = 64,
        isolation_level: str = "read_committed",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError("need 0 < heartbeat_interval_ms < session_timeout_ms")
        margin_ms = heartbeat_interval_ms if lease_margin_ms is None else lease_margin_ms
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topic = topic
        self.endpoints = Endpoints(endpoint, tls_endpoint)
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self._client_id = client_id
        self._poll_timeout_ms = poll_timeout_ms
        self._max_records = max_records
        self._isolation_level = isolation_level
        self._clock = clock
        self._lease = Lease(session_timeout_ms / 1000, margin_ms / 1000)
        self._tick = min(1.0, max(0.05, heartbeat_interval_ms / 4000))

        self._consumer: Any = None
        self._binding = AssignorBinding(topic, self.endpoints)
        self._assigned: frozenset[int] = frozenset()  # the group's last word about us
        self._map: OwnerMap | None = None
        self._rebalancing = True  # until the first assignment
        self._fenced = False  # lease expired since the last assignment
        self._probe = False  # heartbeat probe installed: the lease is enforced
        self._running = False
        self._rebalances = 0
        self._first_assignment = asyncio.Event()
        self._events: asyncio.Queue[tuple[str, frozenset[int]] | None] = asyncio.Queue()
        self._records: asyncio.Queue[list[ShardRecord] | None] = asyncio.Queue(record_buffer)
        self._readers = 0
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group; returns before the first assignment (see `wait_assigned`). A
        ShardOwnership is started once: after `stop()` make a new one."""
        if self._consumer is not None:
            raise RuntimeError("ShardOwnership already started")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=self._client_id,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            partition_assignment_strategy=(bound_assignor(self._binding),),
            # Kept partitions resume where they were; a shard taken over resumes at the previous
            # owner's last commit (pushes for sockets not here yet are dropped by the node).
            enable_auto_commit=True,
            auto_offset_reset="latest",
            # Writers reply inside Kafka transactions: only committed replies may reach a
            # client (SEND_ACK = durable; a fenced writer's acks never surface).
            isolation_level=self._isolation_level,
            **hot_fetch(),
        )
        self._consumer = consumer
        try:
            await consumer.start()
            self._probe = self._install_heartbeat_probe(consumer)
            consumer.subscribe([self.topic], listener=_Listener(self))
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise
        self._running = True
        self._tasks = [
            asyncio.create_task(self._notify(), name="shard-ownership-notify"),
            asyncio.create_task(self._pump(), name="shard-ownership-pump"),
            asyncio.create_task(self._watch_lease(), name="shard-ownership-lease"),
        ]

    async def stop(self) -> None:
        """Leave the group (the survivors take over at once) and report every shard as lost."""
        if not self._running:
            return
        lost = self._announced()
        self._running = False
        pump, lease = self._tasks[1], self._tasks[2]
        for task in (pump, lease):
            task.cancel()
        for task in (pump, lease):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self._consumer.stop()
        finally:
            self._assigned = frozenset()
            if lost:
                self._events.put_nowait(("revoked", lost))
            self._events.put_nowait(None)
            await self._tasks[0]
            self._tasks = []
            while not self._records.empty():
                self._records.get_nowait()
            self._records.put_nowait(None)
            self._first_assignment.set()

    async def wait_assigned(self) -> None:
        """Wait for the first assignment of this member (possibly empty), or for `stop()`."""
        await self._first_assignment.wait()

    # --- queries ----------------------------------------------------------------------------

    def owns(self, connection_shard_id: int) -> bool:
        """True when this gateway may serve the shard now."""
        return connection_shard_id in self._effective()

    @property
    def owned(self) -> frozenset[int]:
        """The shards `owns()` answers True for, now."""
        return self._effective()

    def owner(self, connection_shard_id: int) -> Endpoints | None:
        """The owner's endpoints according to the last owner map received."""
        return self._map.owner(connection_shard_id) if self._map is not None else None

    def owner_endpoint(self, connection_shard_id: int) -> str | None:
        """The owner's primary endpoint (REDIRECT endpoint_hint), or None if unknown."""
        owner = self.owner(connection_shard_id)
        return owner.endpoint if owner is not None else None

    @property
    def owner_map(self) -> OwnerMap | None:
        return self._map

    @property
    def assignment_seq(self) -> int | None:
        """Ownership generation of the last map received (grows with every rebalance)."""
        return self._map.seq if self._map is not None else None

    @property
    def rebalancing(self) -> bool:
        return self._rebalancing

    @property
    def rebalances(self) -> int:
        """Assignments received so far."""
        return self._rebalances

    def _announced(self) -> frozenset[int]:
        """What the callbacks have told the node it owns."""
        return frozenset() if self._fenced else self._assigned

    def _effective(self) -> frozenset[int]:
        if not self._running or self._rebalancing or self._fenced:
            return frozenset()
        if self._probe and not self._lease.valid(self._clock()):
            return frozenset()
        return self._assigned

    # --- records ----------------------------------------------------------------------------

    async def records(self) -> AsyncIterator[list[ShardRecord]]:
        """Batches (one per fetch) of the records of owned partitions, until `stop()`.

        Meant for one reader. Without a reader the newest `record_buffer` batches are kept
        and older ones dropped: the push path is best effort and clients resync with
        PULL_MAILBOX, while a blocked fetch loop would make the member leave the group.
        """
        self._readers += 1
        try:
            while True:
                batch = await self._records.get()
                if batch is None:
                    self._records.put_nowait(None)  # let other readers end too
                    return
                assigned = self._assigned
                kept = [r for r in batch if r.partition in assigned]
                if kept:
                    yield kept
        finally:
            self._readers -= 1

    async def _pump(self) -> None:
        """Fetch continuously: aiokafka also reports group errors through getmany, and a member
        that stops fetching leaves the group after max_poll_interval."""
        while True:
            try:
                fetched = await self._consumer.getmany(
                    timeout_ms=self._poll_timeout_ms, max_records=self._max_records
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("to-gateway fetch failed; retrying")
                await asyncio.sleep(self._tick)
                continue
            batch = [
                ShardRecord(tp.partition, msg.key, msg.value)
                for tp, msgs in sorted(fetched.items())
                for msg in msgs
            ]
            if not batch:
                continue
            if self._readers:
                await self._records.put(batch)
            else:
                if self._records.full():
                    self._records.get_nowait()
                self._records.put_nowait(batch)

    # --- group callbacks (called by aiokafka's coordination task) ----------------------------

    def _group_revoked(self) -> None:
        if self._running:
            self._rebalancing = True

    async def _resolve_positions(self, assigned: Iterable[Any]) -> None:
        """Know where every assigned partition starts reading before owning it.

        Without a committed offset the "latest" reset happens lazily at the first fetch; a
        session admitted as soon as the shard is owned could get a reply produced before that
        fetch, and the reset would skip it. aiokafka allows position() in this callback.
        """
        tps = [tp for tp in assigned if tp.topic == self.topic]
        if not self._running or not tps:
            return
        try:
            await asyncio.gather(*(self._consumer.position(tp) for tp in tps))
        except Exception:  # a rebalance meanwhile: the next assignment resolves again
            log.warning("positions of %d assigned ConnectionShards not resolved", len(tps))

    def _group_assigned(self, assigned: Iterable[Any]) -> None:
        if not self._running:
            return
        new = frozenset(tp.partition for tp in assigned if tp.topic == self.topic)
        previous = self._announced()
        self._lease.renew(self._clock())
        self._assigned = new
        self._map = self._binding.received_map
        self._fenced = False
        self._rebalancing = False
        self._rebalances += 1
        lost, gained = previous - new, new - previous
        log.info(
            "ConnectionShard ownership seq=%s: %d owned (+%d, -%d)",
            self.assignment_seq,
            len(new),
            len(gained),
            len(lost),
        )
        if lost:
            self._events.put_nowait(("revoked", lost))
        if gained:
            self._events.put_nowait(("assigned", gained))
        self._first_assignment.set()

    # --- the lease ----------------------------------------------------------------------------

    def _install_heartbeat_probe(self, consumer: Any) -> bool:
        """Renew the lease on every successful heartbeat, timed at its send. This wraps a
        private aiokafka coroutine (0.14); if it is missing the lease is not enforced between
        rebalances and ownership follows the group's word alone."""
        coordinator: Any = getattr(consumer, "_coordinator", None)
        original = getattr(coordinator, "_do_heartbeat", None)
        if original is None or not inspect.iscoroutinefunction(original):
            log.warning("aiokafka heartbeat hook not found: shard lease not enforced locally")
            return False

        async def probed_heartbeat() -> bool:
            sent_at = self._clock()
            ok = bool(await original())
            if ok:
                self._lease.renew(sent_at)
            return ok

        coordinator._do_heartbeat = probed_heartbeat
        return True

    async def _watch_lease(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            self._check_lease()

    def _check_lease(self) -> None:
        """Turn lease expiry and recovery into on_revoked / on_assigned. Not during a
        rebalance: the broker keeps a member alive while its JoinGroup is pending."""
        if not self._probe or self._rebalancing or not self._running:
            return
        valid = self._lease.valid(self._clock())
        if not valid and not self._fenced:
            self._fenced = True
            log.warning(
                "shard lease expired without a heartbeat: stop serving %d shards",
                len(self._assigned),
            )
            if self._assigned:
                self._events.put_nowait(("revoked", self._assigned))
        elif valid and self._fenced:
            self._fenced = False
            log.warning("heartbeats are back: serving %d shards again", len(self._assigned))
            if self._assigned:
                self._events.put_nowait(("assigned", self._assigned))

    # --- notifications ------------------------------------------------------------------------

    async def _notify(self) -> None:
        while True:
            event = await self._events.get()
            if event is None:
                return
            kind, shards = event
            callback = self.on_assigned if kind == "assigned" else self.on_revoked
            if callback is None:
                continue
            try:
                result = callback(set(shards))
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("ConnectionShard %s callback failed", kind)
