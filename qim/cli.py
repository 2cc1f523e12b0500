"""`qim`: the operator's entry point: the local stack, tokens, groups (audit, replay later)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import click

from qim.admin.cli import admin, group
from qim.auth.cli import token
from qim.devstack.stack import Stack
from qim.gateway.cli import gateway


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate a qim installation: the local stack, tokens, groups (later: audit, replay)."""


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
    if not foreground:
        return
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    click.echo("Press Ctrl-C to stop.")
    stop.wait()
    click.echo("stopping ...")
    stack.down()


@main.command()
def down() -> None:
    """Stop everything `qim up` started."""
    Stack().down()
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

    from qim.devstack.stack import StackConfig, ensure_topics
    from qim.streams import ALL_TOPICS

    created = asyncio.run(ensure_topics(bootstrap, ALL_TOPICS, StackConfig().partition_counts))
    click.echo("created: " + (", ".join(created) if created else "nothing (all exist)"))


@main.group()
def replay() -> None:
    """Rebuild a store from its source log and compare it with the live one (topology replay)."""


@replay.command("mailbox")
@click.option("--shard", type=click.IntRange(min=0), required=True, help="MailboxShard number.")
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
    required=True,
    help="An empty folder for the rebuilt store.",
)
@click.option("--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092")
def replay_mailbox(shard: int, datadir: Path, out: Path, bootstrap: str) -> None:
    """Replay the shard's dispatch partition into OUT and compare byte for byte with the live
    store; exit 1 on any difference."""
    import asyncio
    import os

    from qim.agents.mailbox_options import MailboxOptions
    from qim.agents.mailbox_replay import replay_worker_shard
    from qim.apps.base import ROCKSDB_OPTIONS
    from qim.params import Settings

    options = MailboxOptions.load(
        Settings.load(),
        os.environ,
        bootstrap=bootstrap,
        datadir=datadir,
        store_caps=ROCKSDB_OPTIONS,
    )
    with click.progressbar(length=1, label=f"replaying shard {shard}") as bar:

        def progress(done: int, total: int) -> None:
            bar.length = max(total, 1)
            bar.update(done - bar.pos)

        report = asyncio.run(replay_worker_shard(options, shard, out, progress=progress))
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)


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


main.add_command(token)
main.add_command(gateway)
main.add_command(group)
main.add_command(admin)

if __name__ == "__main__":
    main()
