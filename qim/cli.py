"""`qim`: the operator's entry point: the local stack, tokens, groups (audit, replay later)."""

from __future__ import annotations

import json
import signal
import sys
import threading

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
