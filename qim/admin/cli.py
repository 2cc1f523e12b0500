"""``qim group create|add|remove|role|transfer|dissolve|show`` and ``qim admin serve``.

Register with ``main.add_command(group)`` and ``main.add_command(admin)``. The group commands
talk to the group admin endpoint over HTTP (``--url`` / ``QIM_ADMIN_URL``, ``--secret`` /
``QIM_ADMIN_SECRET``) and print its JSON answer. Exit codes: 0 done; 1 refused by the
ConversationWriter or the endpoint (not worth retrying as is); 2 usage; 3 unavailable or timed
out (retrying is safe: create is refused once the group exists, add/remove skip users already
in or out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from qim.admin.client import AdminHttpError, AdminUnreachable, GroupAdminClient
from qim.admin.wire import (
    DEFAULT_GROUP_ADMIN_PORT,
    DEFAULT_GROUP_ADMIN_URL,
    ENV_ADMIN_SECRET,
    ENV_ADMIN_URL,
)
from qim.streams import runtime

__all__ = ["admin", "group"]

EXIT_REFUSED, EXIT_UNAVAILABLE = 1, 3

_SECRET_HELP = f"Shared secret sent as X-Qim-Admin-Secret (env {ENV_ADMIN_SECRET})."


@dataclass(frozen=True, slots=True)
class _Endpoint:
    url: str
    secret: str | None
    actor: str | None
    timeout_s: float
    as_member: bool = False

    def client(self) -> GroupAdminClient:
        if not self.secret:
            raise click.UsageError(f"the admin secret is missing: --secret or {ENV_ADMIN_SECRET}")
        if self.as_member and not self.actor:
            raise click.UsageError("--as-member needs --actor USER_ID (the acting member)")
        return GroupAdminClient(
            self.url,
            self.secret,
            actor=self.actor,
            timeout_s=self.timeout_s,
            as_member=self.as_member,
        )


@click.group("group")
@click.option(
    "--url",
    envvar=ENV_ADMIN_URL,
    default=DEFAULT_GROUP_ADMIN_URL,
    show_default=True,
    help=f"Group admin endpoint (env {ENV_ADMIN_URL}).",
)
@click.option("--secret", envvar=ENV_ADMIN_SECRET, default=None, help=_SECRET_HELP)
@click.option("--actor", default=None, help="Operator recorded in the CONTROL message.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Seconds to wait for the endpoint.",
)
@click.option(
    "--as-member",
    is_flag=True,
    help="Act on behalf of the member --actor: the group role table (spec 20.2.2) applies.",
)
@click.pass_context
def group(
    ctx: click.Context,
    url: str,
    secret: str | None,
    actor: str | None,
    timeout_s: float,
    as_member: bool,
) -> None:
    """Create groups and change their members through the admin plane (`qim admin serve`).

    Group ids have the form g:NAME. Exit codes: 0 done, 1 refused, 2 usage, 3 unavailable or
    timed out (retrying is safe).
    """
    ctx.obj = _Endpoint(url, secret, actor, timeout_s, as_member)


def _run(endpoint: _Endpoint, call: Callable[[GroupAdminClient], dict[str, Any]]) -> None:
    client = endpoint.client()
    try:
        result = call(client)
    except AdminHttpError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_UNAVAILABLE if exc.retryable else EXIT_REFUSED)
    except AdminUnreachable as exc:
        click.echo(f"error: {exc} (is `qim admin serve` running?)", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    click.echo(json.dumps(result, indent=2, sort_keys=True))


def _group_id(value: str) -> str:
    if not value.startswith("g:") or len(value) <= 2:
        raise click.BadParameter(f"group ids have the form g:NAME, not {value!r}")
    return value


_TENANT = click.option("--tenant", "tenant_id", required=True, help="tenant_id of the group.")
_GROUP = click.argument("group_id", callback=lambda _c, _p, v: _group_id(v))


@group.command("create")
@_GROUP
@_TENANT
@click.option("--owner", "owner_id", required=True, help="user_id of the OWNER (the creator).")
@click.option("--member", "members", multiple=True, help="An invitee (repeatable).")
@click.option(
    "--e2ee",
    is_flag=True,
    help="End-to-end encrypted for the group's whole life (at most e2ee_max_members).",
)
@click.pass_obj
def create(
    endpoint: _Endpoint,
    group_id: str,
    tenant_id: str,
    owner_id: str,
    members: tuple[str, ...],
    e2ee: bool,
) -> None:
    """Create GROUP_ID with an OWNER and invited members."""
    _run(endpoint, lambda c: c.create(tenant_id, group_id, owner_id, members, e2ee=e2ee))


@group.command("promote-room")
@_GROUP
@click.argument("room_id")
@_TENANT
@click.option("--owner", "owner_id", required=True, help="user_id of the group's OWNER.")
@click.pass_obj
def promote_room(
    endpoint: _Endpoint, group_id: str, room_id: str, tenant_id: str, owner_id: str
) -> None:
    """Promote chatroom ROOM_ID to a new group GROUP_ID (spec 14.4): its online members become
    the initial members, history starts at seq 1, nothing is back-filled, the room ends."""
    _run(endpoint, lambda c: c.promote_room(tenant_id, room_id, group_id, owner_id))


@group.command("add")
@_GROUP
@click.argument("members", nargs=-1, required=True)
@_TENANT
@click.pass_obj
def add(endpoint: _Endpoint, group_id: str, members: tuple[str, ...], tenant_id: str) -> None:
    """Add MEMBERS to GROUP_ID (GroupAdd; members already in are skipped)."""
    _run(endpoint, lambda c: c.add(tenant_id, group_id, members))


@group.command("remove")
@_GROUP
@click.argument("members", nargs=-1, required=True)
@_TENANT
@click.option("--ban", is_flag=True, help="Ban as well: the user cannot be re-added by joining.")
@click.pass_obj
def remove(
    endpoint: _Endpoint, group_id: str, members: tuple[str, ...], tenant_id: str, ban: bool
) -> None:
    """Remove MEMBERS from GROUP_ID (GroupRemove), one request per member."""

    def each(client: GroupAdminClient) -> dict[str, Any]:
        results = [client.remove(tenant_id, group_id, m, ban=ban) for m in members]
        return results[-1] if len(results) == 1 else {"results": results}

    _run(endpoint, each)


@group.command("role")
@_GROUP
@click.argument("user_id")
@click.argument("role", type=click.Choice(["ADMIN", "MEMBER", "GUEST"]))
@_TENANT
@click.pass_obj
def role(endpoint: _Endpoint, group_id: str, user_id: str, role: str, tenant_id: str) -> None:
    """Give USER_ID the ROLE in GROUP_ID (grant or revoke ADMIN; the owner's right)."""
    _run(endpoint, lambda c: c.set_role(tenant_id, group_id, user_id, role))


@group.command("transfer")
@_GROUP
@click.argument("new_owner_id")
@_TENANT
@click.pass_obj
def transfer(endpoint: _Endpoint, group_id: str, new_owner_id: str, tenant_id: str) -> None:
    """Make NEW_OWNER_ID (a member) the OWNER of GROUP_ID; the old owner becomes a MEMBER."""
    _run(endpoint, lambda c: c.transfer(tenant_id, group_id, new_owner_id))


@group.command("dissolve")
@_GROUP
@_TENANT
@click.pass_obj
def dissolve(endpoint: _Endpoint, group_id: str, tenant_id: str) -> None:
    """Dissolve GROUP_ID: every member gets the MEMBERSHIP entry, later sends are refused."""
    _run(endpoint, lambda c: c.dissolve(tenant_id, group_id))


@group.command("show")
@_GROUP
@_TENANT
@click.pass_obj
def show(endpoint: _Endpoint, group_id: str, tenant_id: str) -> None:
    """Show GROUP_ID's membership_version and member_count."""
    _run(endpoint, lambda c: c.show(tenant_id, group_id))


@click.group("admin")
def admin() -> None:
    """Run the admin plane's group endpoint."""


@admin.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_GROUP_ADMIN_PORT, show_default=True
)
@click.option(
    "--kafka-bootstrap",
    envvar="QIM_KAFKA_BOOTSTRAP",
    required=True,
    help="Kafka bootstrap servers (env QIM_KAFKA_BOOTSTRAP).",
)
@click.option("--admin-secret", envvar=ENV_ADMIN_SECRET, required=True, help=_SECRET_HELP)
@click.option(
    "--node-id",
    default=lambda: f"admin-{socket.gethostname()}",
    show_default="admin-HOST",
    help="Key of this endpoint's AdminReply records.",
)
@click.option(
    "--conversation-partitions",
    type=click.IntRange(min=1),
    default=16,
    envvar="QIM_CONVERSATION_PARTITION_COUNT",
    show_default=True,
    help="Partitions of qim.conversation-requests (checked at start).",
)
@click.option(
    "--reply-timeout",
    "reply_timeout_s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the writer's AdminReply.",
)
@click.option(
    "--dev-web-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Development stack only: also serve the browser chat client and /dev/token here.",
)
@click.option("--dev-tenant", default="demo", show_default=True, help="Tenant of /dev/token.")
@click.option(
    "--gateway-url", default="ws://127.0.0.1:18080/", show_default=True, help="For the client."
)
def serve(
    host: str,
    port: int,
    kafka_bootstrap: str,
    admin_secret: str,
    node_id: str,
    conversation_partitions: int,
    reply_timeout_s: float,
    dev_web_port: int | None,
    dev_tenant: str,
    gateway_url: str,
) -> None:
    """Serve POST/DELETE/GET /v1/groups... until Ctrl-C (requests go through Kafka)."""
    from qim.admin.groups import GroupAdmin
    from qim.admin.server import GroupAdminServer, serve_group_admin
    from qim.observability.logging import configure as configure_logging

    if not configure_logging("admin"):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if len(admin_secret) < 16:
        raise click.BadParameter("at least 16 characters", param_hint="--admin-secret")

    def ready(server: GroupAdminServer) -> None:
        click.echo(f"group admin endpoint on {server.url} (node {node_id})")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        group_admin = GroupAdmin(
            kafka_bootstrap,
            node_id=node_id,
            partition_count=conversation_partitions,
            timeout_s=reply_timeout_s,
        )
        dev_web = None
        if dev_web_port is not None:
            from qim.admin.devweb import DevWebConfig, start_dev_web

            dev_cfg = DevWebConfig(tenant_id=dev_tenant, gateway_url=gateway_url, host=host)
            try:
                dev_web = await start_dev_web(dev_cfg, dev_web_port)
            except ValueError as exc:  # not the dev stack: the group endpoint still serves
                click.echo(f"browser chat client not served: {exc}", err=True)
            else:
                click.echo(f"browser chat client on http://{host}:{dev_web_port}/")
        try:
            await serve_group_admin(
                group_admin, admin_secret, host=host, port=port, ready=ready, stop=stop
            )
        finally:
            if dev_web is not None:
                await dev_web.cleanup()

    try:
        runtime.run(run())
    except (RuntimeError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
