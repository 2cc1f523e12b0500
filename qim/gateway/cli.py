"""``qim gateway``: run one ConnectionNode (register with ``main.add_command(gateway)``).

Authentication is the Redis-backed AuthService (``--redis-url`` / ``QIM_REDIS_URL``);
``--dev-auth`` swaps in the in-process MemoryAuthenticator for experiments. With a Kafka
bootstrap the node publishes presence, takes ConnectionShards through the gateways' consumer
group (``qim.gateway.ownership.shards``), forwards conversation requests to the ConversationWriter
and delivers its replies (``qim.gateway.routing.router``); without one it owns every shard,
publishes
nothing and drops business frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import click

from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode
from qim.gateway.ports import Authenticator, OwnAll, Ownership
from qim.gateway.routing.send_rate import tenant_views
from qim.observability.logging import configure as configure_logging
from qim.params import Settings
from qim.streams import runtime

__all__ = ["gateway", "run_gateway", "serve_gateway"]

log = logging.getLogger(__name__)


async def serve_gateway(
    config: GatewayConfig,
    *,
    redis_url: str | None = None,
    dev_auth: bool = False,
    group_id: str | None = "qim-gateways",
    stop: asyncio.Event | None = None,
) -> None:
    """Run until ``stop`` is set (or forever), then close connections and flush presence."""
    close_auth: Callable[[], Awaitable[None]] | None = None
    authenticator: Authenticator
    if dev_auth:
        authenticator = MemoryAuthenticator()
    elif redis_url:
        from qim.gateway.auth_adapter import connect_auth_service

        authenticator, close_auth = await connect_auth_service(redis_url, config.settings)
    else:
        raise click.UsageError("AUTH needs --redis-url (QIM_REDIS_URL) or --dev-auth")

    node: ConnectionNode | None = None
    ownership: Ownership = OwnAll(config.advertised_endpoint)
    membership = None
    if config.kafka_bootstrap and group_id:
        from qim.gateway.ownership.shards import ShardOwnership

        def revoked(shards: set[int]) -> None:
            if node is not None:
                node.drop_shards(shards)

        membership = ShardOwnership(
            config.kafka_bootstrap,
            group_id,
            config.advertised_endpoint,
            session_timeout_ms=int(config.settings.shard_lease_ttl),
            on_revoked=revoked,
            isolation_level="read_committed",  # replies are transactional (router.py)
        )
        ownership = membership
    node = ConnectionNode(config, authenticator, ownership=ownership)
    try:
        if membership is not None:
            await membership.start()
            with contextlib.suppress(TimeoutError):  # serve anyway; unowned shards redirect
                await asyncio.wait_for(membership.wait_assigned(), 30)
        await node.start()
        ports = node.listeners
        log.info(
            "ConnectionNode %s: ws=%s tls=%s metrics=%s",
            config.node_id, ports.ws_port, ports.tls_port, ports.metrics_port,
        )  # fmt: skip
        await (stop or asyncio.Event()).wait()
    finally:
        await node.stop()
        if membership is not None:
            await membership.stop()
        if close_auth is not None:
            await close_auth()


def run_gateway(config: GatewayConfig, **options: object) -> None:
    """Blocking entry point: serve until SIGINT/SIGTERM."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await serve_gateway(config, stop=stop, **options)  # type: ignore[arg-type]

    from qim.auth.redis_check import UnsafeRedisError

    try:
        runtime.run(main())
    except UnsafeRedisError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("gateway")
@click.option("--node-id", default=lambda: f"gw-{socket.gethostname()}", show_default="gw-HOST")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--ws-port", type=int, default=8080, show_default=True, help="-1 disables it.")
@click.option("--tls-port", type=int, default=-1, show_default=True, help="qim/1 over TLS.")
@click.option("--metrics-port", type=int, default=9108, show_default=True, help="-1 disables.")
@click.option("--cert", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--key", type=click.Path(exists=True, path_type=Path), default=None)
@click.option("--advertise", default="", help="Endpoint for preferred_endpoint / REDIRECT.")
@click.option("--kafka-bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default=None)
@click.option("--redis-url", envvar="QIM_REDIS_URL", default=None)
@click.option("--group-id", default="qim-gateways", show_default=True)
@click.option("--dev-auth", is_flag=True, help="In-process tokens (never in production).")
@click.option(
    "--conversation-partitions",
    "conversation_partitions",
    type=click.IntRange(min=1),
    envvar="QIM_CONVERSATION_PARTITION_COUNT",
    default=16,
    show_default=True,
    help="Partitions of qim.conversation-requests (checked against the topic at start).",
)
@click.option(
    "--routing/--no-routing",
    default=True,
    show_default=True,
    help="Forward conversation requests and deliver replies (needs --kafka-bootstrap).",
)
@click.option(
    "--mailbox-sync/--no-mailbox-sync",
    envvar="QIM_MAILBOX_SYNC",
    default=True,
    show_default=True,
    help="Login sync with the MailboxNode (AUTH_OK sync fields, PULL_MAILBOX, SYNC_COMPLETE); "
    "on only with routing.",
)
@click.option(
    "--prekeys/--no-prekeys",
    envvar="QIM_PREKEYS",
    default=True,
    show_default=True,
    help="PREKEY_PUBLISH / PREKEY_FETCH through the key worker (qim.apps.keys); on only with "
    "routing.",
)
@click.option(
    "--prekey-partitions",
    "prekey_partitions",
    type=click.IntRange(min=1),
    envvar="QIM_PREKEY_PARTITION_COUNT",
    default=8,
    show_default=True,
    help="Partitions of qim.prekey-requests (checked against the topic at start).",
)
def gateway(
    node_id: str,
    host: str,
    ws_port: int,
    tls_port: int,
    metrics_port: int,
    cert: Path | None,
    key: Path | None,
    advertise: str,
    kafka_bootstrap: str | None,
    redis_url: str | None,
    group_id: str,
    dev_auth: bool,
    conversation_partitions: int,
    routing: bool,
    mailbox_sync: bool,
    prekeys: bool,
    prekey_partitions: int,
) -> None:
    """Run a ConnectionNode: WebSocket and TLS/TCP (ALPN qim/1) listeners, /metrics."""
    if not configure_logging(f"gateway:{node_id}"):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = Settings.load()
        config = GatewayConfig(
            node_id=node_id,
            host=host,
            ws_port=None if ws_port < 0 else ws_port,
            tls_port=None if tls_port < 0 else tls_port,
            metrics_port=None if metrics_port < 0 else metrics_port,
            certfile=cert,
            keyfile=key,
            advertised_endpoint=advertise,
            kafka_bootstrap=kafka_bootstrap,
            route_requests=routing and bool(kafka_bootstrap),
            mailbox_sync=mailbox_sync and routing and bool(kafka_bootstrap),
            conversation_partition_count=conversation_partitions,
            prekeys=prekeys and routing and bool(kafka_bootstrap),
            follow_revocations=bool(kafka_bootstrap),
            prekey_partition_count=prekey_partitions,
            rooms=routing and bool(kafka_bootstrap) and os.environ.get("QIM_ROOMS", "1") != "0",
            room_partition_count=int(os.environ.get("QIM_ROOM_PARTITION_COUNT", "4")),
            room_target_renew_ms=int(os.environ.get("QIM_ROOM_TARGET_RENEW_MS", "10000")),
            settings=settings,
            tenant_settings=tenant_views(settings, os.environ.get("QIM_TENANT_OVERRIDES")),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    run_gateway(config, redis_url=redis_url, dev_auth=dev_auth, group_id=group_id)
