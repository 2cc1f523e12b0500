"""Scenario ``login``: a new device of a user with 0, 1,000 or 10,000 backlog entries.

The backlog is provisioned by ordinary senders (one-to-one messages through the gateway,
RATE_LIMITED answered by waiting ``retry_after_ms``), then a probe login waits until the whole
backlog is served. Measured: AUTH -> ONLINE_READY (``login_and_sync`` without the top-up
pull) p50/p99, entries pulled, and bytes on the wire per login (both directions).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.accounting import payload_for
from qim.bench.histogram import Samples
from qim.bench.loadgen import Device, close_all, login_many, new_client
from qim.bench.report import Column, Result
from qim.bench.target import Target
from qim.bench.wire import ByteCounter
from qim.client import QimError, login_and_sync
from qim.schemas.frames import ErrorCode, SyncEntry

__all__ = ["LoginParams", "run_login"]

COLUMNS = [
    Column("backlog", "backlog"),
    Column("entries pulled", "entries"),
    Column("AUTH->ONLINE_READY p50 (ms)", "login_ms.p50"),
    Column("p99 (ms)", "login_ms.p99"),
    Column("bytes received", "bytes_received"),
    Column("bytes sent", "bytes_sent"),
    Column("provisioning (s)", "provision_s"),
]
_PER_SENDER = 200  # messages each provisioning sender writes
_IN_FLIGHT = 16  # per sender


@dataclass(frozen=True)
class LoginParams:
    backlogs: tuple[int, ...] = (0, 1000)
    repeats: int = 3
    payload_bytes: int = 200
    tenant: str = "bench"
    connect_rate: float = 15.0
    materialize_timeout_s: float = 600.0


def _ignore(user: str, entry: SyncEntry, at: float) -> None:
    """Provisioning senders get their echoes pushed; nothing to count."""


async def _fill(
    sender: Device, user: str, count: int, tag: str, size: int, within_s: float
) -> None:
    """Send ``count`` messages, honouring RATE_LIMITED's retry_after until ``within_s``."""
    gate = asyncio.Semaphore(_IN_FLIGHT)
    deadline = time.monotonic() + within_s

    async def one(i: int) -> None:
        cmid = f"{tag}-{i}"
        async with gate:
            while time.monotonic() < deadline:
                try:
                    await sender.client.send_direct(
                        user, payload_for(cmid, size), client_message_id=cmid, timeout=60
                    )
                    return
                except QimError as exc:  # idempotent resend with the same cmid
                    if exc.code is not ErrorCode.RATE_LIMITED:
                        raise
                    raw = exc.extras.get("retry_after_ms")
                    await asyncio.sleep((raw if isinstance(raw, int) else 1000) / 1000)
            raise RuntimeError(f"{cmid}: still RATE_LIMITED after {within_s:.0f} s")

    await asyncio.gather(*(one(i) for i in range(count)))


async def _login(
    target: Target, tenant: str, user: str, device: str
) -> tuple[float, int, ByteCounter]:
    counter = ByteCounter()
    token = target.token(tenant, user, device)
    t0 = time.monotonic()
    result = await login_and_sync(
        new_client(counter, heartbeat=False), target.ws_url, token, device, top_up=False
    )
    elapsed = (time.monotonic() - t0) * 1000
    await result.client.close()
    return elapsed, len(result.entries), counter


async def _one(target: Target, params: LoginParams, backlog: int, run: str) -> dict[str, Any]:
    user = f"l{run}b{backlog}"
    t0 = time.monotonic()
    if backlog:
        count = math.ceil(backlog / _PER_SENDER)
        names = [f"{user}s{j}" for j in range(count)]
        senders = await login_many(
            target, params.tenant, names, _ignore, connect_rate=params.connect_rate
        )
        try:
            size = params.payload_bytes
            shares = [min(_PER_SENDER, backlog - j * _PER_SENDER) for j in range(count)]
            await asyncio.gather(
                *(
                    _fill(s, user, n, f"p{run}{j}", size, params.materialize_timeout_s)
                    for j, (s, n) in enumerate(zip(senders, shares, strict=True))
                )
            )
        finally:
            await close_all(senders)
        deadline = time.monotonic() + params.materialize_timeout_s
        while (await _login(target, params.tenant, user, "probe"))[1] < backlog:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{user}'s backlog of {backlog} was never fully served")
            await asyncio.sleep(1.0)
    provision_s = time.monotonic() - t0
    latency, entries, received, sent = Samples(), 0, 0, 0
    for r in range(params.repeats):
        elapsed, entries, counter = await _login(target, params.tenant, user, f"d{r}")
        latency.add(elapsed)
        received += counter.received
        sent += counter.sent
    repeats = max(params.repeats, 1)
    return {
        "backlog": backlog,
        "entries": entries,
        "login_ms": latency.summary((50.0, 99.0)),
        "bytes_received": received // repeats,
        "bytes_sent": sent // repeats,
        "provision_s": round(provision_s, 1),
    }


async def run_login(target: Target, params: LoginParams) -> Result:
    run = uuid.uuid4().hex[:6]
    rows = [await _one(target, params, b, run) for b in params.backlogs]
    return Result("login", asdict(params), rows, COLUMNS, {})
