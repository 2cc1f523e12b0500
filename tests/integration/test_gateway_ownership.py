"""ConnectionShard ownership on a real Kafka (direction.md 4.1): the gateways' consumer group
decides who owns each shard, its session is the lease, and every member learns every owner's
endpoint from the assignment itself."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from qim.devstack.stack import Stack
from qim.gateway.ownership.assignor import from_ranges
from qim.gateway.ownership.shards import ShardOwnership, ShardRecord
from qim.streams import TO_GATEWAY

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALL = frozenset(range(256))
SESSION_MS = 6000  # the broker's group.min.session.timeout.ms
HEARTBEAT_MS = 1000
# Correctness bound for a takeover after a crash: the session must expire, then one rebalance.
TAKEOVER_BOUND_S = SESSION_MS / 1000 + 10
KEY = b"t1\x00u42"


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str
) -> float:
    """Poll `check` until it holds; returns the seconds it took."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


class Recorder:
    """Collects a member's on_assigned / on_revoked notifications."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[int]]] = []

    def assigned(self, shards: set[int]) -> None:
        self.events.append(("assigned", frozenset(shards)))

    def revoked(self, shards: set[int]) -> None:
        self.events.append(("revoked", frozenset(shards)))

    def net(self) -> frozenset[int]:
        """What the callbacks told the node it owns."""
        owned: set[int] = set()
        for kind, shards in self.events:
            owned = owned | shards if kind == "assigned" else owned - shards
        return frozenset(owned)


def endpoint(port: int) -> str:
    return f"ws://127.0.0.1:{port}"


def member(
    stack: Stack, group: str, port: int, recorder: Recorder, session_ms: int = SESSION_MS
) -> ShardOwnership:
    return ShardOwnership(
        stack.cfg.kafka.bootstrap,
        group,
        endpoint(port),
        tls_endpoint=f"wss://127.0.0.1:{port + 1}",
        session_timeout_ms=session_ms,
        heartbeat_interval_ms=HEARTBEAT_MS,
        on_assigned=recorder.assigned,
        on_revoked=recorder.revoked,
    )


@asynccontextmanager
async def running(*members: ShardOwnership) -> AsyncIterator[None]:
    try:
        for m in members:
            await m.start()
        yield
    finally:
        for m in members:
            await m.stop()


def group_id() -> str:
    return f"it-gateways-{uuid.uuid4().hex[:8]}"


def split_between(a: ShardOwnership, b: ShardOwnership) -> bool:
    return (
        len(a.owned) == len(b.owned) == 128
        and not a.owned & b.owned
        and a.owned | b.owned == ALL
        and a.assignment_seq == b.assignment_seq
    )


def assert_maps_name_the_owners(*members: ShardOwnership) -> None:
    for viewer in members:
        for m in members:
            for shard in m.owned:
                assert viewer.owner_endpoint(shard) == m.endpoints.endpoint
                assert viewer.owner(shard) == m.endpoints


class MemberProcess:
    """tests.integration.ownership_member in a child process; always killed on exit."""

    def __init__(self, stack: Stack, group: str, port: int) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "tests.integration.ownership_member",
            "--bootstrap",
            stack.cfg.kafka.bootstrap,
            "--group",
            group,
            "--endpoint",
            endpoint(port),
            "--session-ms",
            str(SESSION_MS),
            "--heartbeat-ms",
            str(HEARTBEAT_MS),
        ]
        self.endpoint = endpoint(port)
        self.proc: asyncio.subprocess.Process | None = None
        self.states: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self.events: list[tuple[str, frozenset[int]]] = []
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> MemberProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        if self._reader is not None:
            await self._reader

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            doc = json.loads(line)
            if doc["event"] == "state":
                self.states.put_nowait(doc)
            elif doc["event"] in ("assigned", "revoked"):
                self.events.append((doc["event"], ranges(doc["shards"])))

    async def state(self) -> dict[str, object]:
        await self.send("state")
        return await asyncio.wait_for(self.states.get(), 10)

    async def send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def owned(self) -> frozenset[int]:
        return ranges((await self.state())["owned"])

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)


def ranges(value: object) -> frozenset[int]:
    assert isinstance(value, list)
    return frozenset(from_ranges((a, b) for a, b in value))


async def test_one_member_owns_every_shard_then_a_second_takes_half(stack: Stack) -> None:
    group = group_id()
    rec_a, rec_b = Recorder(), Recorder()
    a = member(stack, group, 7001, rec_a)
    b = member(stack, group, 7101, rec_b)
    async with running(a):
        await eventually(lambda: a.owned == ALL, 30, "the only member to own all 256 shards")
        assert_maps_name_the_owners(a)
        # The callbacks run in their own task (a slow KICK must not delay heartbeats).
        await eventually(lambda: rec_a.net() == ALL, 10, "a's callbacks")
        first_seq = a.assignment_seq
        assert first_seq is not None

        async with running(b):
            took = await eventually(lambda: split_between(a, b), 30, "a 128/128 split")
            print(f"second member balanced after {took:.2f}s")
            assert (a.assignment_seq or 0) > first_seq
            # Sticky: the first member kept half of what it had, gave away only b's share.
            assert a.owned < ALL
            assert_maps_name_the_owners(a, b)
            for shard in range(256):  # every shard's owner, as seen by both members
                owner = a if a.owns(shard) else b
                assert (
                    a.owner_endpoint(shard) == b.owner_endpoint(shard) == owner.endpoints.endpoint
                )
            # The callbacks told each node exactly what it owns.
            await eventually(lambda: rec_a.net() == a.owned, 10, "a's callbacks")
            await eventually(lambda: rec_b.net() == b.owned, 10, "b's callbacks")
            assert rec_a.events[-1] == ("revoked", frozenset(b.owned))

        # b stopped gracefully: a takes everything back.
        await eventually(lambda: a.owned == ALL, 30, "a to take b's shards back")
        assert rec_b.net() == frozenset()


async def test_records_come_only_from_owned_partitions(stack: Stack) -> None:
    group = group_id()
    a = member(stack, group, 7801, Recorder())
    b = member(stack, group, 7901, Recorder())
    got: list[ShardRecord] = []

    async def read() -> None:
        async for batch in a.records():
            got.extend(batch)

    producer = AIOKafkaProducer(bootstrap_servers=stack.cfg.kafka.bootstrap, acks="all")
    await producer.start()
    try:
        async with running(a, b):
            reader = asyncio.create_task(read())
            await eventually(lambda: split_between(a, b), 30, "a 128/128 split")
            mine, theirs = min(a.owned), min(b.owned)
            marker = uuid.uuid4().hex.encode()

            async def delivered() -> bool:
                # A fresh group's positions start at the log end once reset: produce until a
                # record lands after the reset, to both members' partitions.
                for partition in (theirs, mine):
                    await producer.send_and_wait(
                        TO_GATEWAY.name, marker, key=KEY, partition=partition
                    )
                return any(r.value == marker and r.partition == mine for r in got)

            await eventually(delivered, 30, "a record of an owned partition")
            assert {r.partition for r in got} <= a.owned
            assert all(r.key == KEY for r in got)
        await asyncio.wait_for(reader, 10)  # records() ends with stop()
    finally:
        await producer.stop()


async def test_graceful_stop_hands_over_without_waiting_for_the_session(stack: Stack) -> None:
    session_ms = 30_000  # long, so a takeover that waited for expiry would be obvious
    group = group_id()
    rec_a, rec_b = Recorder(), Recorder()
    a = member(stack, group, 7201, rec_a, session_ms)
    b = member(stack, group, 7301, rec_b, session_ms)
    async with running(a, b):
        await eventually(lambda: split_between(a, b), 60, "a 128/128 split")
        b_had = b.owned
        await b.stop()
        assert b.owned == frozenset()
        assert rec_b.net() == frozenset()
        took = await eventually(lambda: a.owned == ALL, session_ms / 1000, "graceful takeover")
        print(f"graceful takeover after {took:.2f}s")
        assert took < session_ms / 2000, "a graceful stop must not wait for the session timeout"
        assert_maps_name_the_owners(a)
        await eventually(lambda: rec_a.net() == ALL, 10, "a's callbacks")
        assert ("assigned", b_had) in rec_a.events


async def test_a_killed_member_is_taken_over_after_the_session_timeout(stack: Stack) -> None:
    group = group_id()
    rec_a = Recorder()
    a = member(stack, group, 7401, rec_a)
    async with running(a), MemberProcess(stack, group, 7501) as b:
        await eventually(lambda: a.owned == ALL, 30, "a to own everything first")

        async def balanced() -> bool:
            return len(a.owned) == 128 and await b.owned() == ALL - a.owned

        await eventually(balanced, 30, "a 128/128 split with the child member")
        b_owned = ALL - a.owned
        for shard in b_owned:
            assert a.owner_endpoint(shard) == b.endpoint
        state = await b.state()
        assert state["seq"] == a.assignment_seq
        assert isinstance(state["map"], dict)
        assert ranges(state["map"][b.endpoint]) == b_owned
        assert ranges(state["map"][a.endpoints.endpoint]) == a.owned

        b.signal(signal.SIGKILL)
        took = await eventually(lambda: a.owned == ALL, TAKEOVER_BOUND_S, "takeover after kill")
        print(f"takeover after SIGKILL: {took:.2f}s (session {SESSION_MS} ms)")
        for shard in range(256):
            assert a.owner_endpoint(shard) == a.endpoints.endpoint
        await eventually(lambda: rec_a.net() == ALL, 10, "a's callbacks")


async def test_a_paused_member_stops_owning_before_its_shards_move(stack: Stack) -> None:
    """A zombie (SIGSTOP longer than the session) must not claim its old shards on waking."""
    group = group_id()
    a = member(stack, group, 7601, Recorder())
    async with running(a), MemberProcess(stack, group, 7701) as b:
        await eventually(lambda: a.owned == ALL, 30, "a to own everything first")

        async def balanced() -> bool:
            return len(a.owned) == 128 and await b.owned() == ALL - a.owned

        await eventually(balanced, 30, "a 128/128 split with the child member")
        b_had = ALL - a.owned
        await eventually(lambda: len(b.events) == 1, 10, "the child's first callback")
        b.signal(signal.SIGSTOP)
        try:
            took = await eventually(lambda: a.owned == ALL, TAKEOVER_BOUND_S, "takeover")
            print(f"takeover from a paused member: {took:.2f}s")
            takeover_seq = a.assignment_seq
            assert takeover_seq is not None
            await b.send("state")  # queued: the child answers it as soon as it runs again
        finally:
            b.signal(signal.SIGCONT)
        woken = await asyncio.wait_for(b.states.get(), 10)
        woken_seq = woken["seq"]
        assert isinstance(woken_seq, int)
        assert ranges(woken["owned"]) == frozenset() or woken_seq > takeover_seq, woken
        # It rejoins and the group balances again.
        await eventually(balanced, TAKEOVER_BOUND_S, "the woken member to rejoin")
        # On waking, the lease had lapsed: the node was told to drop every shard at once, before
        # the group gave it any again, and its callbacks end where its ownership is.
        assert b.events[:2] == [("assigned", b_had), ("revoked", b_had)]
        final = ALL - a.owned

        def b_net() -> frozenset[int]:
            owned: frozenset[int] = frozenset()
            for kind, shards in b.events:
                owned = owned | shards if kind == "assigned" else owned - shards
            return owned

        await eventually(lambda: b_net() == final, 10, "the child's callbacks")
