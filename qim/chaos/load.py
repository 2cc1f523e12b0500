"""The steady load of ``qim chaos`` and its accounting, on the client SDK.

A :class:`Sender` is one device that behaves as 19.2.4 / 20.4.1 ask of a client: a message is
retried with its own ``client_message_id`` after ``retry_after_ms`` (any retriable ERROR), after
a request timeout, and after a reconnect when the connection closed, until it is acknowledged
or its retry budget (``send_retry_budget``, 60 s) is spent. ClientDedup makes every retry of an
acknowledged-but-unseen send harmless, so the accounting is exact: a message is *acked* once a
SEND_ACK came back, and *lost* if it was acked and never reached its recipient's mailbox.

The load is closed-loop per lane (one message in flight per lane, paced at ``interval_s``), so
an outage slows it down instead of piling up retries; the report gives the rate achieved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qim.bench.accounting import cmid_of_payload, payload_for
from qim.bench.loadgen import Pacer, new_client
from qim.bench.target import Target
from qim.client import (
    ConnectionClosedError,
    Identity,
    IllegalTransition,
    QimClient,
    QimError,
    RequestTimeout,
    TransportError,
    login_and_sync,
    retry_delay_ms,
)
from qim.schemas.frames import ErrorCode

__all__ = [
    "Accounting",
    "Outcome",
    "Sender",
    "check_delivery",
    "group_load",
    "mailbox_cmids",
    "steady_load",
]

clock = time.monotonic

# A.6 codes a retry cannot fix: the message is refused, not pending.
FINAL_CODES = frozenset(
    {
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.FANOUT_QUOTA_EXCEEDED,
        ErrorCode.TOKEN_REVOKED,
        ErrorCode.UPGRADE_REQUIRED,
    }
)


@dataclass
class Outcome:
    """One message's fate: acknowledged or not, after how many attempts, and what was seen."""

    acked: bool
    attempts: int
    seconds: float
    codes: Counter[str] = field(default_factory=Counter)
    conversation_seq: int = 0  # the SEND_ACK's, once acked


class Sender:
    """One SDK device that retries and reconnects (module docstring)."""

    def __init__(
        self,
        target: Target,
        tenant: str,
        user: str,
        *,
        device: str = "chaos",
        ack_timeout_s: float = 10.0,
    ) -> None:
        self.target = target
        self.tenant = tenant
        self.user = user
        self.device = device
        self.ack_timeout_s = ack_timeout_s
        self.client: QimClient | None = None
        self.reconnects = 0
        self._generation = 0
        self._lock = asyncio.Lock()

    async def connect(self, within_s: float = 60.0) -> None:
        """Log in (AUTH .. ONLINE_READY), retrying with backoff within ``within_s``."""
        deadline, delay = clock() + within_s, 0.5
        while True:
            token = self.target.token(self.tenant, self.user, self.device)
            try:
                result = await login_and_sync(new_client(), self.target.ws_url, token, self.device)
            except (
                QimError, RequestTimeout, ConnectionClosedError, TransportError, OSError,
                TimeoutError,
            ):  # fmt: skip
                if clock() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            result.client.identity = Identity(self.tenant, self.user)
            self.client = result.client
            self._generation += 1
            return

    async def _reconnect(self, seen: int, within_s: float) -> None:
        async with self._lock:
            if self._generation != seen:
                return  # another lane already did
            old, self.client = self.client, None
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
            self.reconnects += 1
            await self.connect(within_s)

    async def send(
        self,
        peer: str,
        cmid: str,
        payload: bytes,
        budget_s: float,
        *,
        conversation_id: str | None = None,
    ) -> Outcome:
        """One message to ``peer`` (one-to-one) or, with ``conversation_id``, to that group,
        retried as the module docstring says."""
        started = clock()
        deadline = started + budget_s
        outcome = Outcome(False, 0, 0.0)
        while True:
            outcome.attempts += 1
            client, generation = self.client, self._generation
            delay = 0.5
            try:
                if client is None:
                    raise ConnectionClosedError("not connected")
                if conversation_id is None:
                    ack = await client.send_direct(
                        peer, payload, client_message_id=cmid, timeout=self.ack_timeout_s
                    )
                else:
                    ack = await client.send_message(
                        conversation_id, payload, client_message_id=cmid,
                        timeout=self.ack_timeout_s,
                    )  # fmt: skip
            except QimError as exc:
                outcome.codes[exc.name] += 1
                if exc.code in FINAL_CODES:
                    break
                # the server's hint, never earlier, growing with this message's failures
                ms = retry_delay_ms(exc, min(outcome.attempts - 1, 16))
                if ms is None:
                    break
                delay = ms / 1000
            except RequestTimeout:
                outcome.codes["TIMEOUT"] += 1
            except (ConnectionClosedError, TransportError, IllegalTransition, OSError):
                outcome.codes["CLOSED"] += 1
                remaining = deadline - clock()
                if remaining <= 0:
                    break
                try:
                    await self._reconnect(generation, remaining)
                except Exception as exc:  # out of budget, or a failure no retry fixes
                    outcome.codes[f"reconnect:{type(exc).__name__}"] += 1
                    break
                continue
            else:
                outcome.acked, outcome.conversation_seq = True, ack.conversation_seq
                break
            if clock() + delay > deadline:
                break
            await asyncio.sleep(delay)
        outcome.seconds = clock() - started
        return outcome

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()


@dataclass
class Accounting:
    """Every message of a run: to whom, acknowledged or not, and the errors its retries met."""

    sent: dict[str, str] = field(default_factory=dict)  # cmid -> recipient
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    recalled: set[str] = field(default_factory=set)
    """acked messages recalled afterwards: a recalled entry carries no body (13.4), so the
    delivery check leaves them out; their recall's SEND_ACK is the check"""
    recall_codes: Counter[str] = field(default_factory=Counter)
    """cmid -> every recipient of a group message (its ``sent`` value is the group)."""
    acked: set[str] = field(default_factory=set)
    unacked: dict[str, dict[str, int]] = field(default_factory=dict)
    codes: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    started: float = field(default_factory=clock)

    def record(self, cmid: str, recipient: str, outcome: Outcome) -> None:
        self.sent[cmid] = recipient
        self.attempts += outcome.attempts
        self.codes.update(outcome.codes)
        if outcome.acked:
            self.acked.add(cmid)
        else:
            self.unacked[cmid] = dict(outcome.codes)

    def record_group(self, cmid: str, group: str, members: Sequence[str], outcome: Outcome) -> None:
        self.members[cmid] = tuple(members)
        self.record(cmid, group, outcome)

    def expected(self) -> dict[str, set[str]]:
        """recipient -> the acknowledged messages it must have."""
        out: dict[str, set[str]] = {}
        for cmid in self.acked - self.recalled:
            for user in self.members.get(cmid, (self.sent[cmid],)):
                out.setdefault(user, set()).add(cmid)
        return out

    def summary(self) -> dict[str, Any]:
        seconds = max(clock() - self.started, 1e-9)
        return {
            "sent": len(self.sent),
            "acked": len(self.acked),
            "not_acked": len(self.unacked),
            "attempts": self.attempts,
            "retry_codes": dict(sorted(self.codes.items())),
            "acked_per_s": round(len(self.acked) / seconds, 2),
            "recalled": len(self.recalled),
            "recall_failures": dict(sorted(self.recall_codes.items())),
            "not_acked_codes": dict(
                sorted(sum(map(Counter, self.unacked.values()), Counter()).items())
            ),
        }


async def _pace(began: float, interval_s: float, stop: asyncio.Event) -> None:
    """A lane's rest until ``interval_s`` after ``began``, cut short by ``stop``."""
    rest = interval_s - (clock() - began)
    if rest > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rest)


async def steady_load(
    senders: Sequence[Sender],
    peers: Sequence[str],
    accounting: Accounting,
    stop: asyncio.Event,
    *,
    tag: str,
    lanes_per_sender: int = 1,
    interval_s: float = 0.5,
    budget_s: float = 60.0,
    payload_bytes: int = 64,
) -> None:
    """Lanes send one message at a time to the peers in turn until ``stop`` is set; each
    lane's messages are ``<tag>-<lane>-<n>``."""

    async def lane(index: int, sender: Sender) -> None:
        n = 0
        while not stop.is_set():
            peer = peers[(index + n) % len(peers)]
            cmid = f"{tag}-{index}-{n}"
            n += 1
            began = clock()
            outcome = await sender.send(peer, cmid, payload_for(cmid, payload_bytes), budget_s)
            accounting.record(cmid, peer, outcome)
            await _pace(began, interval_s, stop)

    tasks = [
        lane(i * lanes_per_sender + j, sender)
        for i, sender in enumerate(senders)
        for j in range(lanes_per_sender)
    ]
    await asyncio.gather(*tasks)


async def group_load(
    sender: Sender,
    group: str,
    members: Sequence[str],
    accounting: Accounting,
    stop: asyncio.Event,
    *,
    tag: str,
    interval_s: float = 1.0,
    budget_s: float = 60.0,
    payload_bytes: int = 64,
    recall_every: int = 0,
) -> None:
    """One lane of group messages ``<tag>-<n>`` from ``sender`` into ``group`` until ``stop``;
    each acked one must reach every one of ``members``; every ``recall_every``-th acked one is
    recalled right after its SEND_ACK (0: none)."""
    n = 0
    while not stop.is_set():
        cmid = f"{tag}-{n}"
        n += 1
        began = clock()
        outcome = await sender.send(
            group, cmid, payload_for(cmid, payload_bytes), budget_s, conversation_id=group
        )
        accounting.record_group(cmid, group, members, outcome)
        if recall_every and outcome.acked and n % recall_every == 0:
            await _recall(sender, group, cmid, outcome.conversation_seq, accounting)
        await _pace(began, interval_s, stop)


async def _recall(sender: Sender, group: str, cmid: str, seq: int, accounting: Accounting) -> None:
    client = sender.client
    try:
        if client is None:
            raise ConnectionClosedError("not connected")
        await client.recall(group, seq, timeout=sender.ack_timeout_s)
    except Exception as exc:  # a fault in the way: the message stays expected, unrecalled
        accounting.recall_codes[type(exc).__name__] += 1
    else:
        accounting.recalled.add(cmid)


async def mailbox_cmids(
    target: Target, tenant: str, user: str, *, device: str = "chaos-check"
) -> Counter[str]:
    """The client_message_ids in ``user``'s mailbox, as a new device pulls it (with counts:
    a value above 1 is a duplicate entry)."""
    token = target.token(tenant, user, device)
    result = await login_and_sync(new_client(heartbeat=False), target.ws_url, token, device)
    try:
        found: Counter[str] = Counter()
        for entry in result.entries:
            payload = entry.payload_or_ciphertext
            cmid = entry.client_message_id or (cmid_of_payload(payload) if payload else None)
            if cmid:
                found[cmid] += 1
        return found
    finally:
        await result.client.close()


async def check_delivery(
    target: Target,
    tenant: str,
    expected: dict[str, set[str]],
    *,
    within_s: float = 90.0,
    connect_rate: float = 10.0,
) -> dict[str, Any]:
    """Read each recipient's mailbox until every acknowledged message is there (or
    ``within_s`` passed): lost = acknowledged and absent; duplicates = entries seen twice."""
    deadline = clock() + within_s
    pacer = Pacer(connect_rate)
    missing: dict[str, set[str]] = {user: set(cmids) for user, cmids in expected.items()}
    duplicates: dict[str, int] = {}
    reads = 0
    while True:
        for user in sorted(u for u, m in missing.items() if m):
            await pacer.wait()
            try:
                found = await mailbox_cmids(target, tenant, user)
            except (QimError, RequestTimeout, ConnectionClosedError, TransportError, OSError):
                continue
            reads += 1
            missing[user] = expected[user] - found.keys()
            duplicates[user] = sum(c - 1 for cmid, c in found.items() if c > 1)
        if not any(missing.values()) or clock() >= deadline:
            break
        await asyncio.sleep(1.0)
    lost = {user: sorted(m) for user, m in sorted(missing.items()) if m}
    return {
        "recipients": len(expected),
        "acked_expected": sum(len(c) for c in expected.values()),
        "lost": sum(len(m) for m in lost.values()),
        "lost_cmids": {u: m[:20] for u, m in lost.items()},
        "duplicate_entries": sum(duplicates.values()),
        "mailbox_reads": reads,
    }
