"""The gateway's session-list path through a real ConnectionNode (``session_requests``).

* PULL_SESSION_LIST and MARK_READ go to ``qim.user-requests`` at the user's MailboxShard with
  the session's identity (never the frame's); MARK_READ becomes ``action="mark_read"``;
* the SESSION_LIST_BATCH (or ERROR) reply keeps the request's id, whatever the login sync;
* a SessionPush reaches only the session (device, session_epoch) it names, as READ_SYNC,
  SESSION_DELTA and BADGE_UPDATE frames.
"""

from __future__ import annotations

from qim.gateway.routing.replies import ReplyVerdict
from qim.gateway.session_requests import LIST_CORRELATION
from qim.schemas.frames import AuthOk, Error, ErrorCode, OnlineReady, SyncComplete
from qim.schemas.frames.control import MarkRead, ReadSync
from qim.schemas.frames.history import (
    BadgeUpdate,
    PullSessionList,
    SessionDelta,
    SessionEntry,
    SessionListBatch,
)
from qim.schemas.records.session_push import SessionPush, encode_session_push
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullSessionListRequest,
    UserStateRequest,
    encode_user_record,
)
from tests.gateway_support import wait_until
from tests.unit.gateway.test_login_sync_support import TENANT, login, shard, sync_node


async def test_session_list_and_mark_read_are_forwarded_and_answered() -> None:
    async with sync_node() as h:
        client = await login(h, "bob")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk)
        await client.send(PullSessionList(limit=3), request_id=21)
        await client.send(MarkRead(conversation_id="c1", read_conversation_seq=7), request_id=22)
        await wait_until(lambda: len(h.producer.others) == 2)
        (p1, pull), (p2, mark) = h.producer.others
        assert isinstance(pull, PullSessionListRequest) and isinstance(mark, UserStateRequest)
        assert p1 == p2 == shard("bob")
        assert (pull.tenant_id, pull.user_id, pull.device_id) == (TENANT, "bob", "phone")
        assert pull.session_epoch == ok.session_epoch and pull.request_id == 21
        assert pull.correlation_id == LIST_CORRELATION and pull.message.limit == 3
        assert (mark.action, mark.conversation_id, mark.read_conversation_seq) == (
            "mark_read",
            "c1",
            7,
        )

        def reply(**body: object) -> bytes:
            return encode_user_record(
                MailboxReply(
                    tenant_id=TENANT,
                    user_id="bob",
                    device_id="phone",
                    session_epoch=ok.session_epoch,
                    connection_shard=pull.connection_shard,
                    request_id=21,
                    correlation_id=LIST_CORRELATION,
                    **body,  # type: ignore[arg-type]
                )
            )

        batch = SessionListBatch(
            sessions=(SessionEntry(conversation_id="c1", unread_count=2),), snapshot_revision=4
        )
        assert h.router.deliver(reply(session_list=batch)) is ReplyVerdict.DELIVER
        assert await client.expect(SessionListBatch) == batch
        assert client.frames[-1].header.request_id == 21
        moved = Error(code=int(ErrorCode.CURSOR_INVALID), detail="x")
        h.router.deliver(reply(error=moved))
        error = await client.expect(Error)
        assert error.code == int(ErrorCode.CURSOR_INVALID) and error.request_id == 21
        await client.close()


async def test_a_session_push_reaches_only_the_session_it_names() -> None:
    async with sync_node() as h:
        client = await login(h, "bob")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk)
        delta = SessionDelta(conversation_id="c1", projection_mailbox_seq=9, unread_count=1)
        badge = BadgeUpdate(total_unread=1, badge_projection_mailbox_seq=9)
        read = ReadSync(conversation_id="c2", read_conversation_seq=4)

        def push(epoch: int) -> bytes:
            return encode_session_push(
                SessionPush(
                    tenant_id=TENANT,
                    user_id="bob",
                    device_id="phone",
                    connection_id="x",
                    session_epoch=epoch,
                    connection_shard=0,
                    deltas=(delta,),
                    badge=badge,
                    read_syncs=(read,),
                )
            )

        assert h.router.deliver(push(ok.session_epoch + 1)) is ReplyVerdict.STALE_EPOCH
        assert h.router.deliver(push(ok.session_epoch)) is ReplyVerdict.DELIVER
        # behind the login barrier (12.8.3): nothing before ONLINE_READY, then all of it
        await client.send(SyncComplete(sync_to_seq=ok.sync_to_seq), request_id=4)
        await client.expect(OnlineReady)
        assert not [
            b for b in client.bodies() if isinstance(b, SessionDelta | BadgeUpdate | ReadSync)
        ]
        assert await client.expect(ReadSync) == read
        assert await client.expect(SessionDelta) == delta
        assert await client.expect(BadgeUpdate) == badge
        got = h.sample(
            "qim_gateway_to_gateway_records_total", kind="session_push", result="delivered"
        )
        assert got == 1
        await client.close()
