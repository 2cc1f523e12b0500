"""`qim`: the operator's entry point: local stack, tokens, groups, users, audit, replay, bench."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn, Protocol

import click

from qim.admin.cli import admin, group
from qim.admin.rooms import room
from qim.admin.user_show import user
from qim.auth.cli import token
from qim.bench.cli import bench
from qim.chaos.cli import chaos
from qim.devstack.procs import FOREGROUND_PID, stop_foreground
from qim.devstack.stack import LOCAL_BASE_DIR, Stack, adopt_local_stack
from qim.gateway.cli import gateway


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate a qim installation: the local stack, tokens, groups, audit, replay, bench."""
    try:
        adopt_local_stack(LOCAL_BASE_DIR)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@click.option(
    "--foreground/--detach",
    default=False,
    help="Stay in the foreground and stop everything on Ctrl-C (the README's run command).",
)
def up(foreground: bool) -> None:
    """Start Redis, Kafka, the topics and one worker of each app on 127.0.0.1."""
    stack = Stack()
    try:
        stack.up()
    except (RuntimeError, TimeoutError) as exc:
        click.echo(f"qim up failed: {exc}", err=True)
        stack.down()
        sys.exit(1)
    click.echo(json.dumps(stack.status(), indent=2))
    urls = ", ".join(g.url for g in stack.cfg.gateways)
    click.echo(f"qim is up: clients connect to {urls} (Kafka {stack.cfg.kafka.bootstrap})")
    click.echo("a token: .venv/bin/qim token issue --tenant demo --user alice --device phone")
    for a in stack.cfg.admins:
        if a.web_url is not None:
            click.echo(f"try it in a browser: {a.web_url}")
    if not foreground:
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    pid_file = stack.cfg.base_dir / FOREGROUND_PID  # `qim down` elsewhere asks us to stop
    pid_file.write_text(f"{os.getpid()}\n")
    click.echo("Press Ctrl-C (or run `qim down` in another terminal) to stop.")
    try:
        stop.wait()
        click.echo("stopping ...")
        stack.down()
    finally:
        pid_file.unlink(missing_ok=True)


@main.command()
def down() -> None:
    """Stop everything `qim up` started (a foreground `qim up` / `scripts/run` too: it is
    asked to stop its own processes, which only it can reap)."""
    stack = Stack()
    pid = stop_foreground(stack.cfg.base_dir)
    if pid is not None:
        click.echo(f"the foreground qim up (pid {pid}) stopped its stack")
    stack.down()  # whatever is left (a detached stack, or a foreground one that crashed)
    click.echo("qim is down")


@main.command()
def status() -> None:
    """Show which local processes run and whether they answer; exit 1 if any is not ready."""
    st = Stack().status()
    click.echo(json.dumps(st, indent=2))
    ok = st["kafka"]["answers_metadata"] and st["redis"]["answers_ping"]
    ok = ok and all(w["health"] and w["health"].get("ready") for w in st["workers"].values())
    ok = ok and all(g["listening"] for g in st["gateways"].values())
    ok = ok and all(a["listening"] for a in st["admins"].values())
    sys.exit(0 if ok else 1)


@main.group()
def topics() -> None:
    """The declared Kafka topics (qim/streams)."""


@topics.command("create")
@click.option(
    "--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092", show_default=True
)
def topics_create(bootstrap: str) -> None:
    """Create every declared topic that does not exist yet (idempotent)."""
    import asyncio

    from qim.devstack.stack import default_partition_counts, ensure_topics
    from qim.streams import ALL_TOPICS

    created = asyncio.run(ensure_topics(bootstrap, ALL_TOPICS, default_partition_counts()))
    click.echo("created: " + (", ".join(created) if created else "nothing (all exist)"))


@main.group()
def replay() -> None:
    """Rebuild a store from its source log and compare it with the live one (topology replay)."""


@replay.command("mailbox")
@click.option("--shard", type=click.IntRange(min=0), help="MailboxShard number.")
@click.option("--all", "all_shards", is_flag=True, help="Every shard the datadir holds.")
@click.option(
    "--datadir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".run/workers/mailbox-1/data"),
    show_default=True,
    help="The mailbox worker's --datadir (holds the live store).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="An empty folder for the rebuilt store (one subfolder per shard with --all); "
    "default: a temporary folder, removed afterwards.",
)
@click.option("--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092")
def replay_mailbox(
    shard: int | None, all_shards: bool, datadir: Path, out: Path | None, bootstrap: str
) -> None:
    """Replay a shard's dispatch partition into OUT and compare byte for byte with the live
    store; exit 1 on any difference."""
    import asyncio
    import os

    from qim.agents.mailbox.options import MailboxOptions
    from qim.agents.mailbox.replay import replay_worker_shard
    from qim.apps.base import ROCKSDB_OPTIONS
    from qim.params import Settings

    options = MailboxOptions.load(
        Settings.load(),
        os.environ,
        bootstrap=bootstrap,
        datadir=datadir,
        store_caps=ROCKSDB_OPTIONS,
    )
    with _out_folder(out, "qim-replay-mailbox-") as folder:
        _report_each(
            _pick(shard, all_shards, options.store_path(0).parent, "shard-"),
            "replaying shard",
            lambda n, progress: asyncio.run(
                replay_worker_shard(
                    options, n, folder / f"shard-{n}" if all_shards else folder, progress=progress
                )
            ),
        )


@replay.command("history")
@click.option("--partition", type=click.IntRange(min=0), help="Writer (outbox) partition.")
@click.option("--all", "all_partitions", is_flag=True, help="Every partition the datadir holds.")
@click.option(
    "--datadir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".run/workers/conversation-1/data"),
    show_default=True,
    help="The conversation worker's --datadir (holds the live MessageStores).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="An empty folder for the rebuilt store (one subfolder per partition with --all); "
    "default: a temporary folder, removed afterwards.",
)
@click.option("--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092")
def replay_history(
    partition: int | None, all_partitions: bool, datadir: Path, out: Path | None, bootstrap: str
) -> None:
    """Replay an outbox partition into a fresh MessageStore under OUT and compare it row by row
    with the live one; exit 1 on any difference."""
    import asyncio
    import os

    from qim.agents.writer.history_replay import replay_history_partition
    from qim.agents.writer.options import WriterOptions
    from qim.apps.base import ROCKSDB_OPTIONS
    from qim.params import Settings

    options = WriterOptions.load(
        Settings.load(), os.environ, bootstrap=bootstrap, datadir=datadir,
        store_caps=ROCKSDB_OPTIONS,
    )  # fmt: skip
    with _out_folder(out, "qim-replay-history-") as folder:
        _report_each(
            _pick(partition, all_partitions, options.store_path(0).parent, "p"),
            "replaying partition",
            lambda n, progress: asyncio.run(
                replay_history_partition(
                    options, n, folder / f"p{n}" if all_partitions else folder, progress=progress
                )
            ),
        )


@replay.command("projections")
@click.option("--shard", type=click.IntRange(min=0), help="MailboxShard number.")
@click.option("--all", "all_shards", is_flag=True, help="Every shard the datadir holds.")
@click.option(
    "--datadir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".run/workers/mailbox-1/data"),
    show_default=True,
    help="The mailbox worker's --datadir (holds the live stores).",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Drop and rebuild every projection (the worker must be stopped), then check.",
)
def replay_projections_cmd(shard: int | None, all_shards: bool, datadir: Path, apply: bool) -> None:
    """Rebuild every user's session list and badge from the mailbox entries and the 7.5
    conversation state, and compare with what the MailboxNode keeps; exit 1 on a difference."""
    import os

    from qim.agents.mailbox.options import MailboxOptions
    from qim.agents.mailbox.projection_replay import replay_projections
    from qim.apps.base import ROCKSDB_OPTIONS
    from qim.params import Settings

    options = MailboxOptions.load(
        Settings.load(), os.environ, bootstrap="", datadir=datadir, store_caps=ROCKSDB_OPTIONS
    )
    _report_each(
        _pick(shard, all_shards, options.store_path(0).parent, "shard-"),
        "projections of shard",
        lambda n, progress: replay_projections(options, n, apply=apply, progress=progress),
    )


@contextlib.contextmanager
def _out_folder(out: Path | None, prefix: str) -> Iterator[Path]:
    """``--out`` as given, or a temporary folder removed afterwards (the rebuilt copy is only
    there to be compared; README: ``qim replay mailbox --all`` works as written)."""
    if out is not None:
        yield out
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp) / "rebuilt"  # replay writes a fresh folder (it must not exist)


def _pick(one: int | None, every: bool, folder: Path, prefix: str) -> list[int]:
    """The store numbers to replay: ``one``, or with ``every`` each ``<prefix><n>`` folder."""
    if (one is None) == (not every):
        raise click.UsageError("give exactly one of --shard/--partition N or --all")
    if one is not None:
        return [one]
    found = sorted(
        int(p.name[len(prefix) :])
        for p in (folder.iterdir() if folder.is_dir() else ())
        if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
    )
    if not found:
        raise click.ClickException(f"no stores under {folder}")
    return found


class _Report(Protocol):
    @property
    def ok(self) -> bool: ...

    def lines(self) -> Iterable[str]: ...


def _report_each(
    numbers: Iterable[int], label: str, run: Callable[[int, Callable[[int, int], None]], _Report]
) -> NoReturn:
    """Run one replay per store with a progress bar, print each report; exit 1 if any differs."""
    ok = True
    for n in numbers:
        with click.progressbar(length=1, label=f"{label} {n}") as bar:
            report = run(n, _progress(bar))
        for line in report.lines():
            click.echo(line)
        ok = ok and report.ok
    sys.exit(0 if ok else 1)


def _progress(bar: Any) -> Callable[[int, int], None]:
    def progress(done: int, total: int) -> None:
        bar.length = max(total, 1)
        bar.update(done - bar.pos)

    return progress


@main.group()
def audit() -> None:
    """Check the running pipeline against its source log (spec 0.2 orphan audit)."""


@audit.command("dispatch")
@click.option("--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092")
@click.option(
    "--datadir",
    "datadirs",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    default=(Path(".run/workers/mailbox-1/data"),),
    show_default=True,
    help="A mailbox worker's --datadir (repeat for every worker).",
)
@click.option("--tenant", "tenants", multiple=True, help="Audit only this tenant (repeatable).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit_dispatch(
    bootstrap: str, datadirs: tuple[Path, ...], tenants: tuple[str, ...], timeout: float,
    as_json: bool,
) -> None:  # fmt: skip
    """Outbox vs dispatch log vs mailbox stores; exit 1 on any finding, 2 if incomplete."""
    from qim.ops.audit_cli import run_audit_cli

    sys.exit(run_audit_cli(bootstrap, datadirs, tenants, timeout, as_json))


@main.command()
@click.option("--check", is_flag=True, help="Exit 1 if topology.md differs from the code.")
def topology(check: bool) -> None:
    """Regenerate the generated blocks of topology.md from the code (or only check them)."""
    from qim import topology as topo

    if check:
        if not topo.check():
            click.echo("topology.md is stale: run `qim topology`", err=True)
            sys.exit(1)
        click.echo("topology.md is current")
        return
    topo.write()
    click.echo(f"wrote {topo.TOPOLOGY_MD}")


@main.command("push-standins")
@click.option("--base", type=click.Path(path_type=Path), required=True, help="Credentials folder.")
@click.option("--apns-port", type=int, required=True, help="APNs production stand-in (HTTP/2).")
@click.option("--apns-sandbox-port", type=int, required=True, help="APNs sandbox stand-in.")
@click.option("--fcm-port", type=int, required=True, help="FCM v1 + OAuth + control (HTTP/1.1).")
def push_standins(base: Path, apns_port: int, apns_sandbox_port: int, fcm_port: int) -> None:
    """Run the local APNs and FCM stand-ins on 127.0.0.1 until stopped (spec 16, issue 17)."""
    import asyncio

    from qim.devstack.push_standins import run_forever

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_forever(
                base, apns_port=apns_port, apns_sandbox_port=apns_sandbox_port, fcm_port=fcm_port
            )
        )


main.add_command(token)
main.add_command(gateway)
main.add_command(group)
main.add_command(admin)
main.add_command(user)
main.add_command(bench)
main.add_command(chaos)
main.add_command(room)

if __name__ == "__main__":
    main()
