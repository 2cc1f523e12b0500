"""What the per-user limit tests share: a routing gateway owning every ConnectionShard, SDK
devices on it, and the ``qim_gateway_rate_limited_total`` sample of one (tenant, dimension)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from qim.client import HeartbeatConfig, Identity, QimClient
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.params import Settings
from tests.gateway_support import Gateway, owning_gateway


@contextlib.asynccontextmanager
async def limited_gateway(stack: Stack, settings: Settings, name: str) -> AsyncIterator[Gateway]:
    async with owning_gateway(
        stack.cfg.kafka.bootstrap,
        f"qim-{name}-{uuid.uuid4().hex[:8]}",
        "ws://gw",
        settings=settings,
        node_id=name,
        route_requests=True,
        conversation_partition_count=CONVERSATION_PARTITION_COUNT,
    ) as gw:
        yield gw


@contextlib.asynccontextmanager
async def device(gw: Gateway, tenant: str, user: str, name: str) -> AsyncIterator[QimClient]:
    client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=60)
    async with client:
        await client.connect(gw.ws_url, await gw.token(user, name, tenant), name)
        client.identity = Identity(tenant, user)
        yield client


def refused(gw: Gateway, tenant: str, dimension: str) -> float:
    labels = {"tenant": tenant, "dimension": dimension}
    value = gw.node.metrics.registry.get_sample_value("qim_gateway_rate_limited_total", labels)
    assert value is not None, "qim_gateway_rate_limited_total has no sample for the tenant"
    return value
