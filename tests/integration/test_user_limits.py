"""Per-user limits of the ConnectionNode on the real stack (spec 20.4.1, B.5; issue 15.3).

``per_user_history_pull_rate``: a user's PULL_HISTORY requests are admitted while the user's
token bucket has a token; the rest are answered ``ERROR{RATE_LIMITED, retry_after_ms}`` at once
(never silence, never queued behind the MessageStore), and ``retry_after_ms`` is the time a retry
succeeds: each refusal is told a different future token (``qim.core.ratelimit``). The bucket is
the user's, not the connection's: two devices share it (all of a user's devices reach the owner
of the user's ConnectionShard).

Real ConversationWriter worker, an in-process routing gateway, SDK devices over WebSocket. The
rate is the B.5 parameter, set to 5 per 10 s here so that "20 concurrent requests" cannot be
spread over a token's refill by a loaded machine (5/s would refill one every 200 ms).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from qim.client import QimError
from qim.devstack.stack import Stack
from qim.params import Settings
from qim.schemas.frames import ErrorCode, HistoryBatch
from tests.integration.limits_support import device, limited_gateway, refused
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

PULLS = 20
CAPACITY = 5
PERIOD_MS = 10_000  # one token per 2 s: the 15th refusal is promised 30 s (the hint bound)
SETTINGS = Settings.load(
    overrides={
        "per_ip_connect_rate": {"count": 100_000, "period_ms": 1000},
        "per_user_history_pull_rate": {"count": CAPACITY, "period_ms": PERIOD_MS},
    },
    env={},
)


async def test_history_pulls_over_the_users_rate_are_refused_with_a_retry_time_that_works(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-limits-{uuid.uuid4().hex[:6]}"
    writer = FaustWorker(stack, "qim.apps.conversation", tmp_path / "conversation", WRITER_ENV)
    await asyncio.to_thread(writer.start)
    try:
        await writer_serving(writer)
        async with (
            limited_gateway(stack, SETTINGS, "gw-limits") as gw,
            device(gw, tenant, "alice", "phone") as phone,
            device(gw, tenant, "alice", "laptop") as laptop,
        ):
            await phone.send_direct("bob", b"hello", client_message_id="m1")
            conversation = phone.direct_conversation_id("bob")
            calls = [
                (phone if i % 2 else laptop).pull_history(conversation, limit=10)
                for i in range(PULLS)
            ]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)

            batches = [o for o in outcomes if isinstance(o, HistoryBatch)]
            errors = [o for o in outcomes if isinstance(o, QimError)]
            assert len(batches) + len(errors) == PULLS, outcomes  # every request answered
            assert len(batches) == CAPACITY  # the user's bucket, across both devices
            assert all(len(b.messages) == 1 for b in batches)
            assert {e.code for e in errors} == {ErrorCode.RATE_LIMITED}
            hints = sorted(e.retry_after_ms or 0 for e in errors)
            assert all(h > 0 for h in hints)  # 20.4.1 rule 2: always a retry_after_ms
            assert len(set(hints)) == len(hints)  # each refusal is promised its own token
            assert hints[-1] > (PULLS - CAPACITY - 1) * PERIOD_MS // CAPACITY
            assert refused(gw, tenant, "per_user_history_pull_rate") == PULLS - CAPACITY

            # the two earliest refusals retried at their hint are admitted
            loop = asyncio.get_running_loop()
            started = loop.time()
            for hint in hints[:2]:
                await asyncio.sleep(max(0.0, started + hint / 1000 - loop.time()))
                again = await phone.pull_history(conversation, limit=10)
                assert len(again.messages) == 1
            assert refused(gw, tenant, "per_user_history_pull_rate") == PULLS - CAPACITY
    finally:
        await asyncio.to_thread(writer.stop)
