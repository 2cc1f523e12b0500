"""SESSION_DELTA merging on the real stack (12.6.3): a burst into one conversation while the
receiver is online reaches it as fewer absolute frames than messages, the last one final.

Real ``faust worker`` processes of ``qim.apps.conversation`` and ``qim.apps.mailbox``, a
syncing ConnectionNode with the default ``session_delta_merge_window``, SDK devices over
WebSocket; the receiver's frames are recorded on the wire. Two merge points can fold the
burst (the MailboxNode's fold, the ConnectionNode's window); either way no frame may add up
anything: every SESSION_DELTA carries an unread count no larger than the messages committed,
versions never go back, and the last one carries the final count.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from qim.client import Identity
from qim.devstack.stack import Stack
from qim.schemas.frames import Frame
from qim.schemas.frames.history import SessionDelta
from tests.integration.login_support import FrameRecorder, new_client, pipeline, syncing_gateway
from tests.integration.online_support import connect, online, until, warm_up

pytestmark = pytest.mark.integration

BURST = 15  # below the conversation bucket (20 at once, 8.2 L2): none is RATE_LIMITED


def deltas_of(recorder: FrameRecorder, conv: str) -> list[SessionDelta]:
    return [
        f.body
        for f in recorder.received()
        if isinstance(f, Frame)
        and isinstance(f.body, SessionDelta)
        and f.body.conversation_id == conv
    ]


async def test_a_burst_into_one_conversation_is_merged_into_fewer_absolute_frames(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-merge-{uuid.uuid4().hex[:6]}"
    recorder = FrameRecorder()
    async with (
        pipeline(stack, tmp_path),
        syncing_gateway(stack, "gw-merge") as gw,
        online(gw, tenant, "s0", "pc") as sender,
    ):
        assert gw.node.delta_merge is not None  # the default window is on
        token = await gw.token("dana", "phone", tenant)
        dana = await connect(
            gw.ws_url, token, Identity(tenant, "dana"), "phone", client=new_client(recorder)
        )
        try:
            client = sender.result.client
            conv = client.direct_conversation_id("dana")

            async def send(i: int) -> object:
                return await client.send_direct("dana", f"w{i}".encode())

            warm = await warm_up(send, [dana])  # presence reached the MailboxNode

            def unread_reached(count: int) -> bool:
                return any(d.unread_count == count for d in deltas_of(recorder, conv))

            await until(lambda: unread_reached(warm), "the warm-up's SESSION_DELTA")
            before = len(deltas_of(recorder, conv))

            await asyncio.gather(*(send(1000 + i) for i in range(BURST)))  # all acknowledged
            total = warm + BURST
            await until(lambda: unread_reached(total), f"a SESSION_DELTA with unread {total}")

            burst = deltas_of(recorder, conv)[before:]
            ratio = gw.node.metrics.registry.get_sample_value("session_delta_merge_ratio")
            print(f"{BURST} messages -> {len(burst)} SESSION_DELTA; gateway merge ratio {ratio}")
            assert 1 <= len(burst) < BURST
            assert burst[-1].unread_count == total  # the last frame is the final count
            assert all(d.unread_count <= total for d in burst)  # nothing was summed
            versions = [d.projection_mailbox_seq for d in burst]
            assert versions == sorted(versions) and len(set(versions)) == len(versions)
        finally:
            await dana.close()
