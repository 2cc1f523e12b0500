"""``qim user show``: one user as the operator sees it, gathered from where each fact lives.

* devices and their ``session_epoch`` -- the AuthService's Redis session table (the epoch
  counter of each device, and a device revocation if any);
* presence -- the compacted presence topic, read in full for the user's partition (the same
  partition the MailboxNode folds; last record per device wins, a tombstone removes it);
* the MailboxShard and lane (5.2, 6.5.1), the lane's watermark and floor, and the cursor
  bounds -- asked of the MailboxNode that owns the shard (``/mailbox/user``); each given
  mailbox worker URL is tried, the owner answers ``owned_here``.

Read-only: nothing here writes to Redis, Kafka or a store.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

import click
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from qim.agents.mailbox.presence import read_partition, snapshot_of
from qim.auth.keys import device_revocation_key, epoch_key
from qim.params import Settings
from qim.schemas.records.presence import PresenceEntry
from qim.schemas.routing import lane_id, mailbox_shard_id, user_bucket
from qim.streams import PRESENCE

__all__ = ["mailbox_user", "presence_devices", "session_devices", "show_user", "user"]

_GLOB = str.maketrans({c: f"\\{c}" for c in "*?[]\\"})


async def session_devices(
    redis_url: str, tenant_id: str, user_id: str, prefix: str = "qim"
) -> list[dict[str, Any]]:
    """Every device with a ``session_epoch`` counter, sorted by device id."""
    sentinel = epoch_key(prefix, tenant_id, user_id, "")
    base = sentinel[: -len(b":0:")]  # the key without its (empty) device field
    pattern = base.decode("utf-8").translate(_GLOB) + ":*"
    redis = Redis.from_url(redis_url)
    try:
        devices = []
        async for key in redis.scan_iter(match=pattern, count=500):
            length, _, device = key[len(base) + 1 :].partition(b":")
            if not length.isdigit() or int(length) != len(device):
                continue
            name = device.decode("utf-8")
            if epoch_key(prefix, tenant_id, user_id, name) != key:
                continue  # another user whose id extends this one (cannot happen; be sure)
            epoch = await redis.get(key)
            revoked = await redis.get(device_revocation_key(prefix, tenant_id, user_id, name))
            devices.append(
                {
                    "device_id": name,
                    "session_epoch": int(epoch or 0),
                    "revoked_at": None if revoked is None else int(revoked),
                }
            )
        return sorted(devices, key=lambda d: str(d["device_id"]))
    finally:
        await redis.aclose()


def _presence(entry: PresenceEntry, now_ms: int) -> dict[str, Any]:
    return {
        "device_id": entry.device_id,
        "node_id": entry.node_id,
        "connection_shard": entry.connection_shard,
        "session_epoch": entry.session_epoch,
        "client_platform": entry.client_platform,
        "lease_expire_at": entry.lease_expire_at,
        "online": entry.is_online(now_ms),
    }


async def presence_devices(
    bootstrap: str, shard: int, tenant_id: str, user_id: str, now_ms: int
) -> list[dict[str, Any]]:
    """The user's devices in partition ``shard`` of the compacted presence topic."""
    reader = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, client_id="qim-cli"
    )
    await reader.start()
    try:
        tp = TopicPartition(PRESENCE.name, shard)
        start = int((await reader.beginning_offsets([tp]))[tp])
        end = int((await reader.end_offsets([tp]))[tp])
        records: list[Any] = []
        await read_partition(reader, tp, start, end, records)
    finally:
        await reader.stop()
    latest: dict[str, PresenceEntry | None] = {}
    for key, entry in snapshot_of(records):
        if (key.tenant_id, key.user_id) == (tenant_id, user_id):
            latest[key.device_id] = entry
    return [_presence(e, now_ms) for _, e in sorted(latest.items()) if e is not None]


def mailbox_user(urls: Sequence[str], tenant_id: str, user_id: str) -> dict[str, Any] | None:
    """The owning MailboxNode's ``/mailbox/user`` answer (None if no given worker owns it)."""
    query = urllib.parse.urlencode({"tenant": tenant_id, "user": user_id})
    for base in urls:
        try:
            with urllib.request.urlopen(f"{base}/mailbox/user?{query}", timeout=5) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError, urllib.error.HTTPError):
            continue
        if isinstance(body, dict) and body.get("owned_here"):
            return body
    return None


async def show_user(
    tenant_id: str,
    user_id: str,
    *,
    redis_url: str,
    bootstrap: str,
    mailbox_urls: Sequence[str],
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Everything above as one JSON-able dict."""
    s = settings or Settings.load()
    shard = mailbox_shard_id(
        user_bucket(tenant_id, user_id, s.virtual_bucket_count), s.mailbox_shard_count
    )
    now_ms = int(time.time() * 1000)
    mailbox = mailbox_user(mailbox_urls, tenant_id, user_id)
    return {
        "tenant_id": tenant_id,
        "user_id": user_id,
        "mailbox_shard": shard,
        "lane_id": lane_id(tenant_id, user_id, s.lane_count),
        "sessions": await session_devices(redis_url, tenant_id, user_id),
        "presence": await presence_devices(bootstrap, shard, tenant_id, user_id, now_ms),
        "mailbox": mailbox,
    }


def _local_mailbox_urls() -> list[str]:
    from qim.devstack.stack import StackConfig

    return [
        f"http://127.0.0.1:{w.web_port}"
        for w in StackConfig().workers
        if w.module == "qim.apps.mailbox"
    ]


@click.group("user")
def user() -> None:
    """Look at one user: devices, presence, mailbox lane and cursor bounds."""


@user.command("show")
@click.option("--tenant", required=True)
@click.option("--user", "user_id", required=True)
@click.option("--redis-url", envvar="QIM_REDIS_URL", default="redis://127.0.0.1:16379/0")
@click.option("--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092")
@click.option(
    "--mailbox-url",
    "mailbox_urls",
    multiple=True,
    help="A mailbox worker's web address (repeatable); default: the local stack's.",
)
def show(
    tenant: str, user_id: str, redis_url: str, bootstrap: str, mailbox_urls: tuple[str, ...]
) -> None:
    """Print the user as JSON; exit 1 if no given mailbox worker owns the user's shard."""
    urls = list(mailbox_urls) or _local_mailbox_urls()
    report = asyncio.run(
        show_user(tenant, user_id, redis_url=redis_url, bootstrap=bootstrap, mailbox_urls=urls)
    )
    click.echo(json.dumps(report, indent=2))
    sys.exit(0 if report["mailbox"] is not None else 1)
