"""``qim chaos run``: a steady mixed SDK load while qim processes are SIGKILLed, paused past
their lease, and Kafka and Redis restart; then the release gate of 26.8 (issue 25).

1. log the senders in; one group per ``group_sizes`` entry, of that many members, created by
   a sender;
2. run, for ``duration_s``: one-to-one lanes (:func:`~qim.chaos.load.steady_load`), one group
   lane per group (:func:`~qim.chaos.load.group_load`), and a churn lane that logs a
   recipient in on a fresh device, loads its session list, marks its top row read and logs
   out; meanwhile the fault plan (:func:`plan_faults`, seeded, so a run can be repeated) fires
   one fault every ``fault_every_s``;
3. the end checks, once the load has stopped and every process is back:
   - **delivery**: every acknowledged message is in each of its recipients' mailboxes exactly
     once (a new device's full pull);
   - **audit**: ``qim audit dispatch`` over the run's tenant has no finding;
   - **always-zero**: every counter of :data:`~qim.observability.always_zero.ALWAYS_ZERO` on
     every process's page is 0 (a page that does not declare one fails);
   - **projections**: ``qim replay projections --all`` (every session list and badge equals a
     recount from the entries) exits 0;
   - **history**: ``qim replay history --all`` (every writer partition's MessageStore equals
     a rebuild from the outbox) exits 0;
   - **no repair**: every fault's process came back by itself (a fault that raised is named).

Every ``recall_every``-th group message is recalled right after its SEND_ACK; a recalled
entry carries no body, so those leave the delivery check (their recall's ack is the check).
``ok`` is all of them. Not covered yet: edits in the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from qim.bench.loadgen import new_client
from qim.bench.target import Target
from qim.chaos.faults import (
    BrokerRestart,
    DiskFull,
    Fault,
    ProcessKill,
    ProcessPause,
    RedisRestart,
    process_names,
)
from qim.chaos.load import Accounting, Sender, check_delivery, group_load, steady_load
from qim.client import login_and_sync
from qim.devstack.stack import ROOT, Stack
from qim.observability.always_zero import ALWAYS_ZERO, NotExported, nonzero

__all__ = ["SoakParams", "always_zero_pages", "plan_faults", "run_soak"]

# app module -> the kind of process whose always-zero counters its page carries
_KIND_OF_MODULE = {"qim.apps.conversation": "conversation", "qim.apps.mailbox": "mailbox"}


@dataclass(frozen=True)
class SoakParams:
    duration_s: float = 150.0
    fault_every_s: float = 20.0
    seed: int = 1
    broker_restarts: int = 1
    redis_restarts: int = 0
    pauses: int = 1
    disk_fulls: int = 0
    disk_full_s: float = 15.0
    pause_s: float = 20.0  # past shard_lease_ttl (B.1, 15 s)
    kill_down_s: float = 2.0
    broker_down_s: float = 10.0
    redis_down_s: float = 4.0
    senders: int = 4
    lanes_per_sender: int = 1
    interval_s: float = 0.5
    peers: int = 8
    group_sizes: tuple[int, ...] = (10,)
    """one group per size, each with one lane of messages"""
    group_interval_s: float = 1.0
    recall_every: int = 10
    churn_every_s: float = 2.0
    delivery_within_s: float = 180.0
    audit_timeout_s: float = 180.0
    tenant: str = "chaos"


def plan_faults(
    params: SoakParams,
    processes: list[str],
    pausable: list[str],
    disk_limited: list[str] | None = None,
) -> list[tuple[float, Fault]]:
    """``(seconds after the start, fault)``: one slot every ``fault_every_s`` strictly inside
    the run; the broker restarts, Redis restarts and pauses spread evenly over the slots, every
    other slot a SIGKILL of the next process of a seeded shuffle of ``processes``."""
    slots = [
        (i + 1) * params.fault_every_s
        for i in range(int(params.duration_s // params.fault_every_s))
        if (i + 1) * params.fault_every_s < params.duration_s
    ]
    rng = random.Random(params.seed)
    special: list[Fault] = [BrokerRestart(params.broker_down_s)] * params.broker_restarts
    special += [RedisRestart(params.redis_down_s)] * params.redis_restarts
    special += [
        ProcessPause(pausable[i % len(pausable)], params.pause_s)
        for i in range(params.pauses if pausable else 0)
    ]
    full = disk_limited or []
    special += [
        DiskFull(full[i % len(full)], params.disk_full_s)
        for i in range(params.disk_fulls if full else 0)
    ]
    if len(special) > len(slots):
        raise ValueError(f"{len(special)} special faults do not fit in {len(slots)} slots")
    # the special faults sit at evenly spaced slots (a seeded order among them)
    rng.shuffle(special)
    at = {round(k * len(slots) / len(special)) for k in range(len(special))} if special else set()
    order = list(processes)
    rng.shuffle(order)
    plan: list[tuple[float, Fault]] = []
    kills = 0
    specials = iter(special)
    for index, when in enumerate(slots):
        if index in at:
            plan.append((when, next(specials)))
        elif order:
            plan.append((when, ProcessKill(order[kills % len(order)], params.kill_down_s)))
            kills += 1
    return plan


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def always_zero_pages(stack: Stack) -> dict[str, tuple[str, str | None]]:
    """process -> (kind, its /metrics page or None when it does not answer) for every process
    that exports always-zero counters."""
    pages: dict[str, tuple[str, str | None]] = {}
    for w in stack.cfg.workers:
        if w.module in _KIND_OF_MODULE:
            text = _scrape(f"http://127.0.0.1:{w.web_port}/metrics")
            pages[w.name] = (_KIND_OF_MODULE[w.module], text)
    for g in stack.cfg.gateways:
        pages[g.name] = ("gateway", _scrape(f"http://127.0.0.1:{g.metrics_port}/metrics"))
    return pages


def _always_zero_verdict(stack: Stack) -> dict[str, Any]:
    pages = always_zero_pages(stack)
    unanswered = sorted(p for p, (_, text) in pages.items() if text is None)
    try:
        moved = nonzero({p: (k, t) for p, (k, t) in pages.items() if t is not None})
        missing: str | None = None
    except NotExported as exc:
        moved, missing = {}, str(exc)
    names = sum(len(ALWAYS_ZERO[k]) for k, t in pages.values() if t is not None)
    return {
        "counters_checked": names,
        "nonzero": moved,
        "unanswered_pages": unanswered,
        "not_exported": missing,
        "ok": not moved and not unanswered and missing is None,
    }


def _qim(stack: Stack, *args: str, timeout_s: float) -> dict[str, Any]:
    """Run ``qim <args>`` against the stack; its exit status and the end of its output."""
    env = {**os.environ, **stack.cfg.env()}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "qim.cli", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"exit": None, "tail": f"timed out after {timeout_s:g} s"}
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    return {"exit": done.returncode, "tail": tail}


async def _churn(
    target: Target,
    tenant: str,
    users: list[str],
    stop: asyncio.Event,
    every_s: float,
    tally: Counter[str],
) -> None:
    """Log a recipient in on a fresh device, load its list, mark the top row read, log out."""
    n = 0
    while not stop.is_set():
        user = users[n % len(users)]
        n += 1
        device = f"churn{n % 4}"
        try:
            result = await asyncio.wait_for(
                login_and_sync(
                    new_client(heartbeat=False),
                    target.ws_url,
                    target.token(tenant, user, device),
                    device,
                ),
                30.0,
            )
            try:
                rows = await result.client.load_session_list(timeout=10.0)
                if rows:
                    top = rows[0]
                    await result.client.mark_read(top.conversation_id, top.latest_conversation_seq)
                    tally["marked_read"] += 1
                tally["logins"] += 1
            finally:
                with contextlib.suppress(Exception):
                    await result.client.close()
        except Exception as exc:  # a fault in the way: counted, the next round tries again
            tally[f"failed:{type(exc).__name__}"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def run_soak(
    stack: Stack,
    params: SoakParams,
    *,
    disk_limited: list[str] | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring against ``stack``'s running processes."""
    cfg = stack.cfg
    target = Target.from_stack(cfg)
    tag = "soak" + time.strftime("%H%M%S")
    users = [f"{tag}s{i}" for i in range(params.senders)]
    peers = [f"{tag}r{i}" for i in range(params.peers)]
    processes = process_names(stack)
    pausable = [w.name for w in cfg.workers if w.module in _KIND_OF_MODULE]
    plan = plan_faults(params, processes, pausable, disk_limited)
    progress(
        f"{len(users)} senders, {len(peers)} peers, groups of {list(params.group_sizes)}; "
        f"{len(plan)} faults over {params.duration_s:g} s"
    )

    senders = [Sender(target, params.tenant, u) for u in users]
    for sender in senders:
        await sender.connect()
    groups: list[tuple[Sender, str, list[str]]] = []
    for g, size in enumerate(params.group_sizes):
        owner = senders[g % len(senders)]
        group_id = f"g:{tag}-{g}"
        members = [f"{tag}g{g}m{i}" for i in range(size - 1)]
        assert owner.client is not None
        await owner.client.create_group(group_id, tuple(members), timeout=60.0)
        groups.append((owner, group_id, members))

    accounting = Accounting()
    stop = asyncio.Event()
    churn: Counter[str] = Counter()
    loads = [
        asyncio.create_task(
            steady_load(
                senders, peers, accounting, stop, tag=tag,
                lanes_per_sender=params.lanes_per_sender, interval_s=params.interval_s,
            )
        ),
        *(
            asyncio.create_task(
                group_load(
                    owner, group_id, members, accounting, stop, tag=f"{tag}-g{g}",
                    interval_s=params.group_interval_s, recall_every=params.recall_every,
                )
            )
            for g, (owner, group_id, members) in enumerate(groups)
        ),
        asyncio.create_task(
            _churn(
                target, params.tenant, peers + [m for _, _, ms in groups for m in ms], stop,
                params.churn_every_s, churn,
            )
        ),
    ]  # fmt: skip
    started = time.monotonic()
    faults: list[dict[str, Any]] = []
    try:
        for when, fault in plan:
            await asyncio.sleep(max(0.0, started + when - time.monotonic()))
            what = getattr(fault, "process", "") or fault.name
            progress(f"t={when:5.0f}s {fault.name} {what}")
            try:
                done = await fault.run(stack)
            except Exception as exc:  # the process did not come back by itself
                done = {"fault": fault.name, "error": f"{type(exc).__name__}: {exc}"}
                progress(f"  FAILED: {done['error']}")
            faults.append({"at_s": when, **done})
            s = accounting.summary()
            progress(f"  so far {s['acked']} acked of {s['sent']} sent")
        await asyncio.sleep(max(0.0, started + params.duration_s - time.monotonic()))
    finally:
        stop.set()
        await asyncio.gather(*loads, return_exceptions=True)
    reconnects = sum(s.reconnects for s in senders)
    for sender in senders:
        await sender.close()
    progress(f"load stopped: {accounting.summary()}; churn {dict(churn)}")

    progress("checking every acked message in each recipient's mailbox")
    delivery = await check_delivery(
        target, params.tenant, accounting.expected(), within_s=params.delivery_within_s
    )
    progress(
        f"lost {delivery['lost']} of {delivery['acked_expected']} acked entries, "
        f"{delivery['duplicate_entries']} duplicates"
    )
    datadir = cfg.base_dir / "workers" / "mailbox-1" / "data"
    progress("qim audit dispatch")
    audit = await asyncio.to_thread(
        _qim, stack, "audit", "dispatch", "--datadir", str(datadir),
        "--tenant", params.tenant, "--timeout", str(params.audit_timeout_s),
        timeout_s=params.audit_timeout_s + 60,
    )  # fmt: skip
    progress(f"  exit {audit['exit']}: {audit['tail'][-3:]}")
    progress("qim replay projections --all")
    projections = await asyncio.to_thread(
        _qim, stack, "replay", "projections", "--all", "--datadir", str(datadir),
        timeout_s=600,
    )  # fmt: skip
    progress(f"  exit {projections['exit']}")
    progress("qim replay history --all")
    history = await asyncio.to_thread(
        _qim, stack, "replay", "history", "--all", "--datadir",
        str(cfg.base_dir / "workers" / "conversation-1" / "data"), timeout_s=900,
    )  # fmt: skip
    progress(f"  exit {history['exit']}")
    zero = _always_zero_verdict(stack)
    progress(f"always-zero: {zero}")
    repaired = [f for f in faults if "error" in f]
    kills = sum(1 for f in faults if f["fault"] == "kill-9" and "error" not in f)
    kinds = Counter(f["fault"] for f in faults if "error" not in f)
    ok = (
        delivery["lost"] == 0
        and delivery["duplicate_entries"] == 0
        and audit["exit"] == 0
        and projections["exit"] == 0
        and history["exit"] == 0
        and zero["ok"]
        and not repaired
    )
    return {
        "scenario": "chaos-run",
        "ok": ok,
        "headline": (
            f"{params.duration_s:g} s, faults survived {dict(sorted(kinds.items()))}: "
            f"{delivery['lost']} of {delivery['acked_expected']} acked entries lost, "
            f"{delivery['duplicate_entries']} duplicates, audit exit {audit['exit']}, "
            f"projections exit {projections['exit']}, history exit {history['exit']}, always-zero "
            f"{'0' if zero['ok'] else zero['nonzero'] or zero}"
        ),
        "params": asdict(params),
        "faults": faults,
        "kills": kills,
        "load": {**accounting.summary(), "reconnects": reconnects, "churn": dict(churn)},
        "delivery": delivery,
        "audit": audit,
        "projections": projections,
        "history": history,
        "always_zero": zero,
        "needed_repair": repaired,
    }
