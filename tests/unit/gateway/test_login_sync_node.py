"""Login sync through a real ConnectionNode; the fake MailboxNode answers over an in-memory
producer (``test_login_sync_support``). Invariants (spec 9.3.1, 9.3.4, direction.md 3 and 4.1):

* SyncAuthRequest / PullMailboxRequest go to ``qim.user-requests`` at the user's MailboxShard,
  with the session's identity, never the frame's;
* AUTH_OK carries the MailboxNode's sync fields; a cursor verdict is sent instead and the
  connection closed without kicking the device's live connection; no answer in time (or a
  request Kafka refuses) is SHARD_MOVED{retry_after_ms} + close;
* MAILBOX_BATCH keeps its request_id; SYNC_COMPLETE is ONLINE_READY only once the served
  batches cover (start, sync_to_seq], else SYNC_INCOMPLETE and the link stays;
* a reply for another session_epoch is dropped; other record kinds are still counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import qim.gateway.cli as cli
from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.config import GatewayConfig
from qim.gateway.node import ConnectionNode
from qim.gateway.presence_writer import MemoryPresence
from qim.gateway.routing.replies import ReplyVerdict
from qim.schemas.frames import (
    AuthOk,
    Error,
    ErrorCode,
    MailboxBatch,
    MailboxCursor,
    OnlineReady,
    Ping,
    Pong,
    PullMailbox,
    Redirect,
    SyncComplete,
)
from qim.schemas.records.user_requests import (
    MailboxReply,
    PullMailboxRequest,
    SyncAuthRequest,
    encode_user_record,
)
from qim.schemas.routing import lane_id
from qim.streams.topics import USER_REQUESTS
from tests.gateway_support import wait_until
from tests.unit.gateway.test_login_sync_support import (
    SETTINGS,
    TENANT,
    FakeMailbox,
    SyncProducer,
    login,
    shard,
    sync_node,
)


async def test_auth_ok_carries_the_sync_fields_of_the_users_mailbox_shard() -> None:
    """9.3.1: sync_to_seq = W[lane] at AUTH; the request names the session and its shard."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20, 30)
    async with sync_node(mailbox) as h:
        client = await login(h, "bob")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk) and client.frames[-1].header.request_id == 3
        assert (ok.sync_to_seq, ok.lane_watermark, ok.has_offline) == (30, 30, True)
        assert ok.lane_id == lane_id(TENANT, "bob", int(SETTINGS.lane_count))
        assert ok.pending_entry_count_hint == 3 and ok.mailbox_cursor_token
        assert ok.session_epoch > 0
        ((partition, request),) = h.producer.user_requests()
        assert isinstance(request, SyncAuthRequest) and partition == shard("bob")
        assert (request.tenant_id, request.user_id, request.device_id) == (TENANT, "bob", "phone")
        assert request.session_epoch == ok.session_epoch and request.cursor is None
        assert request.connection_shard == h.node.logins.shard_of(TENANT, "bob")
        assert [t for t, *_ in h.producer.sent] == [USER_REQUESTS.name]
        assert h.sample("qim_gateway_sync_auth_latency_seconds_count") == 1
        await wait_until(lambda: len(h.presence.entries) == 1)  # presence after AUTH_OK
        await client.close()


async def test_batches_keep_their_request_id_and_sync_complete_waits_for_coverage() -> None:
    """9.3.4 / T30: SYNC_INCOMPLETE until (start, sync_to_seq] is served, the link stays."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20, 30)
    async with sync_node(mailbox) as h:
        client = await login(h, "bob")
        await client.send(SyncComplete(sync_to_seq=30), request_id=9)
        early = await client.expect(Error)
        assert early.code == int(ErrorCode.SYNC_INCOMPLETE) and early.request_id == 9
        await client.ping()  # still connected
        await client.send(PullMailbox(after_seq=15, up_to_seq=30), request_id=12)
        upper = await client.expect(MailboxBatch)
        assert client.frames[-1].header.request_id == 12
        assert [e.mailbox_seq for e in upper.entries] == [20, 30]
        await client.send(PullMailbox(after_seq=0, up_to_seq=15, max_items=1), request_id=11)
        lower = await client.expect(MailboxBatch)
        assert [e.mailbox_seq for e in lower.entries] == [10] and not lower.has_more
        await client.send(SyncComplete(sync_to_seq=31), request_id=13)
        wrong = await client.expect(Error)
        assert wrong.code == int(ErrorCode.SYNC_INCOMPLETE) and wrong.request_id == 13
        await client.send(SyncComplete(sync_to_seq=30), request_id=14)
        assert await client.expect(OnlineReady) == OnlineReady()
        assert client.frames[-1].header.request_id == 14
        pulls = [r for _, r in h.producer.user_requests() if isinstance(r, PullMailboxRequest)]
        assert [r.correlation_id for r in pulls] == ["pull:15", "pull:0"]
        assert {p for p, r in h.producer.user_requests()} == {shard("bob")}
        assert h.sample("qim_gateway_sync_complete_total", result="online_ready") == 1
        assert h.sample("qim_gateway_sync_complete_total", result="sync_incomplete") == 2
        assert h.sample("qim_gateway_mailbox_batches_total", result="entries") == 2
        got = h.sample(
            "qim_gateway_to_gateway_records_total", kind="mailbox_reply", result="delivered"
        )
        assert got == 3  # the AUTH answer and two batches
        await client.close()


async def test_nothing_offline_lets_sync_complete_follow_auth_ok_at_once() -> None:
    """T22: has_offline=false -> SYNC_COMPLETE directly -> ONLINE_READY."""
    async with sync_node() as h:
        client = await login(h, "carol")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk) and not ok.has_offline and ok.sync_to_seq == 0
        await client.send(SyncComplete(sync_to_seq=0), request_id=4)
        assert await client.expect(OnlineReady) == OnlineReady()
        await client.close()


async def test_an_expired_cursor_is_refused_without_kicking_the_live_device() -> None:
    """9.3.1 check 2 / T24: CURSOR_EXPIRED{trim_watermark, rebuild_required}, never AUTH_OK."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20)
    async with sync_node(mailbox) as h:
        first = await login(h, "bob")
        ok = first.bodies()[-1]
        assert isinstance(ok, AuthOk)
        mailbox.trim["bob"] = 15
        stale = MailboxCursor(token=ok.mailbox_cursor_token, last_applied_mailbox_seq=10)
        second = await login(h, "bob", mailbox_cursor=stale)
        (refused,) = await second.refusal()
        assert isinstance(refused, Error) and refused.code == int(ErrorCode.CURSOR_EXPIRED)
        assert (refused.trim_watermark, refused.rebuild_required) == (15, True)
        assert refused.request_id == 3
        assert isinstance(await first.ping(), Pong)  # the live connection was not replaced
        forged = MailboxCursor(token=b"\x01forged", last_applied_mailbox_seq=10)
        third = await login(h, "bob", mailbox_cursor=forged)
        (invalid,) = await third.refusal()
        assert isinstance(invalid, Error) and invalid.code == int(ErrorCode.CURSOR_INVALID)
        assert h.sample("auth_attempts_total", result="cursor_expired") == 1
        assert h.sample("auth_attempts_total", result="cursor_invalid") == 1
        assert h.sample("connections_closed_total", reason="cursor_rejected") == 2
        assert len(h.node.registry) == 1
        await first.close()


async def test_no_answer_in_time_is_shard_moved_and_leaves_nothing_behind() -> None:
    """direction.md 4.1: an unreachable MailboxShard -> SHARD_MOVED{retry_after_ms} + close."""
    mailbox = FakeMailbox(answering=False)
    async with sync_node(mailbox, mailbox_sync_timeout_ms=150) as h:
        client = await login(h, "dave")
        (moved,) = await client.refusal()
        assert isinstance(moved, Error) and moved.code == int(ErrorCode.SHARD_MOVED)
        assert moved.retry_after_ms and moved.request_id == 3
        assert "unreachable (timeout)" in moved.detail
        assert len(h.node.registry) == 0 and not h.presence.entries
        assert h.router.mailbox is not None and h.router.mailbox.waiting == 0
        assert h.sample("auth_attempts_total", result="shard_moved") == 1


class Flipping:
    """Owns every ConnectionShard until ``mine`` turns False."""

    def __init__(self) -> None:
        self.mine = True

    def owns(self, connection_shard_id: int) -> bool:
        return self.mine

    def owner_endpoint(self, connection_shard_id: int) -> str | None:
        return "ws://gw-other/"


async def test_a_shard_lost_while_the_mailbox_answered_redirects_instead() -> None:
    """5.3.2: AUTH_OK only from the ConnectionShard's owner, checked again after the wait."""
    ownership = Flipping()

    class Losing(FakeMailbox):
        def answer(
            self, partition: int, request: SyncAuthRequest | PullMailboxRequest
        ) -> MailboxReply:
            ownership.mine = False
            return super().answer(partition, request)

    async with sync_node(Losing(), ownership=ownership) as h:
        client = await login(h, "ivan")
        (redirect,) = await client.refusal()
        assert isinstance(redirect, Redirect) and redirect.endpoint_hint == "ws://gw-other/"
        assert len(h.node.registry) == 0 and not h.presence.entries


async def test_a_request_kafka_refuses_is_shard_moved_at_once() -> None:
    async with sync_node(fail_user_requests=True) as h:
        client = await login(h, "erin")
        (moved,) = await asyncio.wait_for(client.refusal(), 3)
        assert isinstance(moved, Error) and moved.code == int(ErrorCode.SHARD_MOVED)
        assert "unreachable (kafka)" in moved.detail


async def test_a_pull_that_cannot_be_produced_is_answered_and_the_link_kept() -> None:
    async with sync_node() as h:
        client = await login(h, "frank")
        h.producer.fail_user_requests = True
        await client.send(PullMailbox(after_seq=0), request_id=21)
        error = await client.expect(Error)
        assert error.code == int(ErrorCode.SHARD_MOVED) and error.request_id == 21
        assert error.retry_after_ms
        assert isinstance(await client.ping(), Pong)
        await client.close()


async def test_replies_of_other_sessions_are_dropped_and_other_kinds_counted() -> None:
    """15.2.2: the epoch decides; 27.2.1: an unknown kind is counted, never fatal."""
    async with sync_node() as h:
        client = await login(h, "gina")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk)
        base: dict[str, Any] = {
            "tenant_id": TENANT,
            "user_id": "gina",
            "device_id": "phone",
            "session_epoch": ok.session_epoch,
            "connection_shard": h.node.logins.shard_of(TENANT, "gina"),
            "request_id": 5,
            "correlation_id": "pull:0",
            "mailbox_batch": MailboxBatch(covered_through_seq=0),
        }

        def deliver(**overrides: Any) -> ReplyVerdict:
            return h.router.deliver(encode_user_record(MailboxReply(**(base | overrides))))

        assert deliver(session_epoch=ok.session_epoch - 1) is ReplyVerdict.STALE_EPOCH
        assert deliver(device_id="tablet") is ReplyVerdict.NO_SESSION
        assert deliver(correlation_id="auth:gw-sync:x:1") is ReplyVerdict.NO_SESSION
        other = msgspec.msgpack.encode({"kind": "room_batch", "tenant_id": TENANT})
        assert h.router.deliver(other) is ReplyVerdict.UNKNOWN_KIND
        broken = msgspec.msgpack.encode({"kind": "mailbox_reply", "tenant_id": 7})
        assert h.router.deliver(broken) is ReplyVerdict.MALFORMED
        assert deliver() is ReplyVerdict.DELIVER
        assert await client.expect(MailboxBatch) == MailboxBatch(covered_through_seq=0)
        labels = {"kind": "mailbox_reply", "result": "stale_session_epoch"}
        assert h.sample("qim_gateway_to_gateway_records_total", **labels) == 1
        push_labels = {"kind": "room_batch", "result": "unknown_kind"}
        assert h.sample("qim_gateway_to_gateway_records_total", **push_labels) == 1
        await client.close()


async def test_the_user_requests_topic_must_have_one_partition_per_mailbox_shard() -> None:
    mailbox = FakeMailbox()
    producer = SyncProducer(mailbox, user_request_partitions=16)
    cfg = GatewayConfig(
        node_id="gw-count",
        kafka_bootstrap="127.0.0.1:9",
        route_requests=True,
        mailbox_sync=True,
        settings=SETTINGS,
    )
    node = ConnectionNode(
        cfg, MemoryAuthenticator(), presence=MemoryPresence(), request_producer=producer
    )
    with pytest.raises(RuntimeError, match="mailbox_shard_count is 64"):
        await node.start()
    await node.stop()


def test_sync_rides_the_routing_and_needs_it() -> None:
    with pytest.raises(ValueError, match="needs route_requests"):
        GatewayConfig(node_id="n", kafka_bootstrap="127.0.0.1:9", mailbox_sync=True)


async def test_without_sync_the_login_is_the_old_one() -> None:
    """mailbox_sync off: no user request; SYNC_COMPLETE is unrouted, answered as not offered."""
    mailbox = FakeMailbox()
    mailbox.add("hal", 5)
    async with sync_node(mailbox, mailbox_sync=False) as h:
        client = await login(h, "hal")
        ok = client.bodies()[-1]
        assert isinstance(ok, AuthOk) and (ok.sync_to_seq, ok.has_offline) == (0, False)
        assert h.producer.user_requests() == [] and h.router.mailbox is None
        await client.send(SyncComplete(sync_to_seq=0), request_id=2)
        await client.send(Ping(ping_id=1), request_id=3)
        refusal = await client.expect(Error)  # never silence (issue 16), and no close
        assert refusal.request_id == 2 and "SYNC_COMPLETE" in refusal.detail
        assert isinstance(await client.expect(Pong), Pong)
        assert h.sample("qim_gateway_frames_unrouted_total", frame="SYNC_COMPLETE") == 1
        await client.close()


@pytest.mark.parametrize(
    ("args", "env", "synced"),
    [
        ([], {}, True),  # on whenever routing is (the production default)
        (["--no-mailbox-sync"], {}, False),
        ([], {"QIM_MAILBOX_SYNC": "false"}, False),
        (["--no-routing"], {}, False),  # sync rides the routing
    ],
)
def test_qim_gateway_syncs_whenever_it_routes(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], synced: bool
) -> None:
    seen: list[GatewayConfig] = []
    monkeypatch.setattr(cli, "run_gateway", lambda config, **_: seen.append(config))
    monkeypatch.delenv("QIM_MAILBOX_SYNC", raising=False)
    argv = ["--kafka-bootstrap", "127.0.0.1:9", "--dev-auth", *args]
    result = CliRunner().invoke(cli.gateway, argv, env=env)
    assert result.exit_code == 0, result.output
    assert seen[0].mailbox_sync is synced


async def test_an_ack_past_the_served_prefix_counts_cursor_advanced_by_push() -> None:
    """24.1.5 / 6.8: the cursor moves only through MAILBOX_BATCH. A PULL_MAILBOX whose
    ``acked_seq`` lies beyond what this session was served contiguously is a client that moved
    its cursor on pushes (or past a gap): still served, and counted."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20, 30)
    async with sync_node(mailbox) as h:
        client = await login(h, "bob")
        registry = h.node.metrics.registry
        assert registry.get_sample_value("cursor_advanced_by_push_total") == 0  # exported
        await client.send(PullMailbox(after_seq=0, up_to_seq=20, acked_seq=0), request_id=11)
        assert [e.mailbox_seq for e in (await client.expect(MailboxBatch)).entries] == [10, 20]
        assert registry.get_sample_value("cursor_advanced_by_push_total") == 0
        # 30 was never served to this session: the client took it from somewhere else
        await client.send(PullMailbox(after_seq=20, up_to_seq=30, acked_seq=30), request_id=12)
        served = await client.expect(MailboxBatch)  # answered anyway
        assert client.frames[-1].header.request_id == 12
        assert [e.mailbox_seq for e in served.entries] == [30]
        assert registry.get_sample_value("cursor_advanced_by_push_total") == 1
        await client.send(PullMailbox(after_seq=30, acked_seq=30), request_id=13)
        await client.expect(MailboxBatch)  # now within the served prefix: not counted again
        assert registry.get_sample_value("cursor_advanced_by_push_total") == 1
        await client.close()


async def test_an_unanswered_pull_is_shard_moved_at_its_deadline_and_a_late_reply_dropped() -> None:
    """Issue 15.3: a PULL_MAILBOX the MailboxNode never answers is answered at the deadline,
    with its request_id, the link kept; the reply that comes after that answer is dropped."""
    mailbox = FakeMailbox()
    mailbox.add("erin", 10)
    async with sync_node(mailbox, mailbox_request_timeout_ms=1_000) as h:
        client = await login(h, "erin")
        assert isinstance(client.bodies()[-1], AuthOk)
        mailbox.answering = False  # the MailboxNode is gone
        await client.send(PullMailbox(after_seq=0), request_id=21)
        moved = await client.expect(Error)
        assert moved.code == int(ErrorCode.SHARD_MOVED) and moved.request_id == 21
        assert moved.retry_after_ms and "unreachable (timeout)" in moved.detail
        assert h.router.mailbox is not None and h.router.mailbox.awaiting == 0
        assert h.sample("qim_gateway_mailbox_requests_total", kind="pull_mailbox",
                        result="timeout") == 1  # fmt: skip
        # the MailboxNode comes back and answers the old request: the client has its answer
        (late,) = [r for _, r in h.producer.user_requests() if isinstance(r, PullMailboxRequest)]
        h.router.deliver(encode_user_record(mailbox.answer(shard("erin"), late)))
        assert h.sample("qim_gateway_mailbox_requests_total", kind="reply", result="late") == 1
        mailbox.answering = True
        await client.send(PullMailbox(after_seq=0), request_id=22)
        batch = await client.expect(MailboxBatch)  # the retry is served, and only it
        assert client.frames[-1].header.request_id == 22 and batch.entries
        assert len([b for b in client.bodies() if isinstance(b, MailboxBatch)]) == 1
        await client.close()
