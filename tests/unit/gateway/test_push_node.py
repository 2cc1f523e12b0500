"""PushBatch through a real ConnectionNode (spec 11.1.1, 5.4.3, 9.4): the router's glue.

Invariants: a recipient whose ``connection_id`` is a live connection of this node with the
batch's ``session_epoch`` gets one PUSH_EVENTS, only after ONLINE_READY; any other recipient
becomes one PRESENCE_STALE on ``qim.user-requests`` at the batch's MailboxShard; the records
are counted under ``kind="push_batch"``.
"""

from __future__ import annotations

import msgspec

from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import AuthOk, OnlineReady, PushEvents, SyncComplete
from qim.schemas.records.push import (
    STALE_EPOCH_MISMATCH,
    STALE_UNKNOWN_CONNECTION,
    PushBatch,
    PushRecipient,
    encode_push_record,
)
from qim.schemas.records.user_requests import decode_user_request
from qim.streams.topics import USER_REQUESTS
from tests.unit.gateway.test_login_sync_support import TENANT, login, sync_node


def batch(*recipients: PushRecipient, mailbox_shard: int = 3) -> bytes:
    return encode_push_record(
        PushBatch(
            tenant_id=TENANT,
            connection_shard=0,
            mailbox_shard=mailbox_shard,
            message_id=b"\x01" * 16,
            conversation_id="g:a",
            conversation_seq=4,
            last_activity_id=b"\x02" * 16,
            sender_id="x",
            created_at=1,
            recipients=recipients,
        )
    )


async def test_a_push_batch_reaches_the_live_connection_and_reports_the_stale_ones() -> None:
    async with sync_node() as h:
        client = await login(h, "gina")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk)
        (conn_id,) = h.node.connections
        live = PushRecipient(
            connection_id=conn_id,
            session_epoch=ok.session_epoch,
            user_id="gina",
            device_id="phone",
            mailbox_seq=ok.sync_to_seq + 5,
        )
        await client.send(SyncComplete(sync_to_seq=ok.sync_to_seq), request_id=9)
        assert await client.expect(OnlineReady) == OnlineReady()

        verdict = h.router.deliver(
            batch(
                live,
                msgspec.structs.replace(live, session_epoch=ok.session_epoch - 1),
                msgspec.structs.replace(live, connection_id="gone", user_id="hal"),
            )
        )
        assert verdict is ReplyVerdict.DELIVER
        push = await client.expect(PushEvents)
        assert [e.mailbox_seq for e in push.events] == [live.mailbox_seq]
        assert push.events[0].message_id == b"\x01" * 16
        assert push.last_pushed_user_seq == live.mailbox_seq
        assert (await client.ping()).last_pushed_user_seq == live.mailbox_seq

        stale = [
            (partition, decode_user_request(value))
            for topic, _, value, partition in h.producer.sent
            if topic == USER_REQUESTS.name and b"presence_stale" in value
        ]
        reasons = sorted((p, getattr(r, "reason", "")) for p, r in stale)
        assert reasons == [(3, STALE_EPOCH_MISMATCH), (3, STALE_UNKNOWN_CONNECTION)]
        labels = {"kind": "push_batch", "result": "delivered"}
        assert h.sample("qim_gateway_to_gateway_records_total", **labels) == 1
        assert h.router.deliver(batch()) is ReplyVerdict.NO_SESSION
        await client.close()
