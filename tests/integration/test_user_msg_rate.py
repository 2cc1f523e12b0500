"""``per_user_msg_rate`` across conversations on the real stack (spec 8.2 L1b, 20.4.1; issue 14.6).

One user spraying SEND_MESSAGE at many peers (so at many conversations, on many writer
partitions) gets the bucket's burst admitted and every other send answered
``ERROR{RATE_LIMITED, retry_after_ms}`` with its request_id, from two devices alike (one bucket
per user, not per connection or conversation); another user of the same tenant, sending at the
same time, is not affected.
Real ConversationWriter worker, an in-process routing gateway that owns every ConnectionShard,
SDK devices over WebSocket. The rate is set to 1 per hour with a burst of 5 here, so that a
loaded machine cannot spread the spray over a token's refill: exactly the burst passes.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from qim.client import QimError
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.params import Settings
from qim.schemas.frames import ErrorCode, SendAck
from qim.schemas.records.requests import conversation_partition
from tests.integration.limits_support import device, limited_gateway, refused
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

BURST = 5
PEERS = 24
SETTINGS = Settings.load(
    overrides={
        "per_ip_connect_rate": {"count": 100_000, "period_ms": 1000},
        "per_user_msg_rate": {"count": 1, "period_ms": 3_600_000},
        "per_user_msg_rate_burst": BURST,
    },
    env={},
)


async def test_one_user_spraying_many_conversations_is_limited_and_another_user_is_not(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-msgrate-{uuid.uuid4().hex[:6]}"
    writer = FaustWorker(stack, "qim.apps.conversation", tmp_path / "conversation", WRITER_ENV)
    await asyncio.to_thread(writer.start)
    try:
        await writer_serving(writer)
        async with (
            limited_gateway(stack, SETTINGS, "gw-msgrate") as gw,
            device(gw, tenant, "spammer", "phone") as phone,
            device(gw, tenant, "spammer", "laptop") as laptop,
            device(gw, tenant, "carol", "phone") as carol,
        ):
            peers = [f"p{i}" for i in range(PEERS)]
            partitions = {
                conversation_partition(
                    tenant, phone.direct_conversation_id(p), CONVERSATION_PARTITION_COUNT
                )
                for p in peers
            }
            assert len(partitions) > 1, "the peers' conversations must span writer partitions"
            sprays = [
                (phone if i % 2 else laptop).send_direct(p, b"buy now", client_message_id=f"s{i}")
                for i, p in enumerate(peers)
            ]
            calm = [
                carol.send_direct(f"friend{i}", b"hi", client_message_id=f"c{i}")
                for i in range(BURST)
            ]
            outcomes = await asyncio.gather(*sprays, *calm, return_exceptions=True)
            spray, others = outcomes[:PEERS], outcomes[PEERS:]

            acks = [o for o in spray if isinstance(o, SendAck)]
            errors = [o for o in spray if isinstance(o, QimError)]
            assert len(acks) + len(errors) == PEERS, spray  # every send answered
            assert len(acks) == BURST  # one bucket for the user: both devices, every peer
            assert {e.code for e in errors} == {ErrorCode.RATE_LIMITED}
            assert {e.detail for e in errors} == {"per_user_msg_rate"}
            assert all((e.retry_after_ms or 0) > 0 for e in errors)  # 20.4.1 rule 2
            assert all(e.request_id for e in errors)
            assert all(isinstance(o, SendAck) for o in others), others  # carol: unaffected
            assert refused(gw, tenant, "per_user_msg_rate") == PEERS - BURST

    finally:
        await asyncio.to_thread(writer.stop)
