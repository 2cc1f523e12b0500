"""The group admin endpoint against the suite's real Kafka; the test plays the writer.

The endpoint must produce an AdminGroupRequest at the group's conversation partition (the
group's single writer, direction.md §4.3) and answer once the matching AdminReply is committed
on ``qim.admin-replies`` (read_committed: an aborted reply is never taken), or time out with a
clear error. The CLI (``qim group ...``) is driven against the same endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from click.testing import CliRunner

from qim.admin import (
    AdminHttpError,
    GroupAdmin,
    GroupAdminClient,
    GroupAdminServer,
    start_group_admin_server,
)
from qim.admin.openapi import COMMITTED
from qim.cli import main
from qim.client import Identity, QimError
from qim.core.conversation.ids import direct_conversation_id
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, Stack
from qim.schemas.frames import Error, ErrorCode
from qim.schemas.records.requests import (
    AdminGroupRequest,
    AdminReply,
    conversation_partition,
    decode_conversation_request,
    encode_record,
)
from qim.streams.topics import ADMIN_REPLIES, CONVERSATION_REQUESTS
from qim.streams.transit import load_transit_sealer
from tests.integration.test_gateway_routing import gateway, online
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

SECRET = "test-admin-secret-0123456789"
TENANT = "t-admin"
WAIT_S = 20.0

TRANSIT = load_transit_sealer()
"""Opens the gateway's hop seal on conversation requests (topology.md decision 44)."""


def gid() -> str:
    return f"g:{uuid.uuid4().hex[:10]}"


class FakeWriter:
    """Reads AdminGroupRequests from the end of qim.conversation-requests; replies on demand."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"fake-writer-{uuid.uuid4().hex}"
        )
        self.seen: list[tuple[int, AdminGroupRequest]] = []

    async def start(self) -> None:
        await self.consumer.start()
        await self.producer.start()
        tps = [
            TopicPartition(CONVERSATION_REQUESTS.name, p)
            for p in range(CONVERSATION_PARTITION_COUNT)
        ]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:
            await self.consumer.position(tp)

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def request_for(self, group_id: str) -> tuple[int, AdminGroupRequest]:
        async with asyncio.timeout(WAIT_S):
            while True:
                for seen in self.seen:
                    if seen[1].group_id == group_id:
                        self.seen.remove(seen)
                        return seen
                fetched = await self.consumer.getmany(timeout_ms=200)
                for tp, records in fetched.items():
                    for r in records:
                        request = decode_conversation_request(TRANSIT.open(r.value))
                        if isinstance(request, AdminGroupRequest):
                            self.seen.append((tp.partition, request))

    async def reply(
        self, request: AdminGroupRequest, *, abort: bool = False, **fields: Any
    ) -> None:
        """Commit (or abort) an AdminReply the way the writer does: in a transaction."""
        assert request.reply_to is not None
        reply = AdminReply(
            node_id=request.reply_to.node_id,
            correlation_id=request.reply_to.correlation_id,
            **fields,
        )
        await self.producer.begin_transaction()
        await self.producer.send_and_wait(
            ADMIN_REPLIES.name, encode_record(reply), key=reply.key, partition=0
        )
        if abort:
            await self.producer.abort_transaction()
        else:
            await self.producer.commit_transaction()


@pytest.fixture(scope="module")
async def writer(stack: Stack) -> AsyncIterator[FakeWriter]:
    fake = FakeWriter(stack.cfg.kafka.bootstrap)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


async def serve(stack: Stack, timeout_s: float) -> GroupAdminServer:
    admin = GroupAdmin(
        stack.cfg.kafka.bootstrap,
        partition_count=CONVERSATION_PARTITION_COUNT,
        timeout_s=timeout_s,
    )
    return await start_group_admin_server(admin, SECRET, port=0)


@pytest.fixture(scope="module")
async def server(stack: Stack) -> AsyncIterator[GroupAdminServer]:
    started = await serve(stack, timeout_s=WAIT_S)
    try:
        yield started
    finally:
        await started.close()


def http(server: GroupAdminServer, secret: str = SECRET) -> GroupAdminClient:
    return GroupAdminClient(server.url, secret, actor="ops-1", timeout_s=WAIT_S + 10)


async def test_create_is_produced_at_the_groups_partition_and_answered_by_its_reply(
    server: GroupAdminServer, writer: FakeWriter
) -> None:
    group = gid()
    call = asyncio.create_task(
        asyncio.to_thread(http(server).create, TENANT, group, "alice", ["bob", "carol"])
    )
    partition, request = await writer.request_for(group)
    assert partition == conversation_partition(TENANT, group, CONVERSATION_PARTITION_COUNT)
    assert (request.action, request.actor, request.member_ids) == (
        "create",
        "alice",
        ("bob", "carol"),
    )
    assert request.reply_to is not None and request.reply_to.node_id == server.admin.node_id
    await writer.reply(request, abort=True, membership_version=99, member_count=99)
    await writer.reply(request, membership_version=1, member_count=3)
    assert await call == {
        "tenant_id": TENANT,
        "group_id": group,
        "action": "create",
        "membership_version": 1,
        "member_count": 3,
    }


async def test_an_e2ee_create_carries_the_flag_over_http_and_the_cli(
    server: GroupAdminServer, writer: FakeWriter
) -> None:
    """Spec 22.1: the flag is set at creation only (``POST /v1/groups {e2ee}``,
    ``qim group create --e2ee``); an ordinary create does not carry it."""
    group, plain = gid(), gid()
    call = asyncio.create_task(
        asyncio.to_thread(functools.partial(http(server).create, e2ee=True), TENANT, group, "al")
    )
    _, request = await writer.request_for(group)
    assert (request.action, request.e2ee) == ("create", True)
    await writer.reply(request, membership_version=1, member_count=1)
    assert (await call)["membership_version"] == 1
    args = ["group", "--url", server.url, "--secret", SECRET, "--actor", "ops-3"]
    for gid_, flags, expected in ((group, ["--e2ee"], True), (plain, [], False)):
        argv = [*args, "create", gid_, "--tenant", TENANT, "--owner", "al", *flags]
        pending = asyncio.create_task(asyncio.to_thread(CliRunner().invoke, main, argv))
        _, request = await writer.request_for(gid_)
        assert request.e2ee is expected
        await writer.reply(request, membership_version=1, member_count=1)
        result = await pending
        assert result.exit_code == 0, result.output


async def test_add_remove_ban_and_show_carry_the_operator_and_the_flags(
    server: GroupAdminServer, writer: FakeWriter
) -> None:
    group, client = gid(), http(server)
    expected = [
        (lambda: client.add(TENANT, group, ["dave"]), ("add", ("dave",), False)),
        (lambda: client.remove(TENANT, group, "dave", ban=True), ("remove", ("dave",), True)),
        (lambda: client.show(TENANT, group), ("show", (), False)),
    ]
    for call, (action, members, ban) in expected:
        pending = asyncio.create_task(asyncio.to_thread(call))
        _, request = await writer.request_for(group)
        assert (request.action, request.member_ids, request.ban) == (action, members, ban)
        assert request.actor == "ops-1" and request.tenant_id == TENANT
        await writer.reply(request, membership_version=4, member_count=2)
        answer = await pending
        assert answer["membership_version"] == 4 and answer["member_count"] == 2


async def test_a_writer_refusal_is_an_http_error_with_the_spec_code(
    server: GroupAdminServer, writer: FakeWriter
) -> None:
    group = gid()
    call = asyncio.create_task(asyncio.to_thread(http(server).add, TENANT, group, ["x"]))
    _, request = await writer.request_for(group)
    denied = Error(code=int(ErrorCode.PERMISSION_DENIED), detail="no_such_group")
    await writer.reply(request, error=denied)
    with pytest.raises(AdminHttpError) as info:
        await call
    assert info.value.status == 403 and not info.value.retryable
    assert info.value.body["error"] == "PERMISSION_DENIED"
    assert info.value.body["detail"] == "no_such_group"


async def test_no_reply_times_out_cleanly_with_a_clear_error(
    stack: Stack, writer: FakeWriter
) -> None:
    quick = await serve(stack, timeout_s=1.0)
    try:
        group = gid()
        with pytest.raises(AdminHttpError) as info:
            await asyncio.to_thread(http(quick).create, TENANT, group, "alice")
        assert info.value.status == 504 and info.value.retryable
        assert "no AdminReply to create" in info.value.body["detail"]
        assert "retrying is safe" in info.value.body["detail"]
        await writer.request_for(group)  # it was produced all the same
        result = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["group", "--url", quick.url, "--secret", SECRET, "show", group, "--tenant", TENANT],
        )
        assert result.exit_code == 3, result.output
        assert "HTTP 504 timeout" in result.output
        assert quick.admin._waiter.waiting == 0  # nothing left behind
    finally:
        await quick.close()


async def test_the_cli_prints_the_answer_and_refuses_bad_input(
    server: GroupAdminServer, writer: FakeWriter
) -> None:
    group = gid()
    args = ["group", "--url", server.url, "--secret", SECRET, "--actor", "ops-2"]
    invoke = asyncio.to_thread(
        CliRunner().invoke, main, [*args, "add", group, "erin", "frank", "--tenant", TENANT]
    )
    pending = asyncio.create_task(invoke)
    _, request = await writer.request_for(group)
    assert (request.member_ids, request.actor) == (("erin", "frank"), "ops-2")
    await writer.reply(request, membership_version=2, member_count=3)
    result = await pending
    assert result.exit_code == 0, result.output
    assert '"member_count": 3' in result.output
    bad = CliRunner().invoke(main, [*args, "add", "team", "erin", "--tenant", TENANT])
    assert bad.exit_code == 2 and "g:NAME" in bad.output


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["role", "USER:bob", "ADMIN"], ("set_role", ("bob",), "ADMIN")),
        (["transfer", "USER:bob"], ("transfer", ("bob",), "")),
        (["dissolve"], ("dissolve", (), "")),
    ],
)
async def test_the_cli_role_transfer_and_dissolve_act_on_behalf_of_the_member(
    server: GroupAdminServer,
    writer: FakeWriter,
    command: list[str],
    expected: tuple[str, tuple[str, ...], str],
) -> None:
    """``qim group --actor alice --as-member role|transfer|dissolve`` produces the request the
    writer checks against alice's role (spec 20.2.2); its refusal exits 1 with the code."""
    group = gid()
    argv = [a.removeprefix("USER:") for a in command]
    args = ["group", "--url", server.url, "--secret", SECRET, "--actor", "alice", "--as-member"]
    invoke = asyncio.to_thread(
        CliRunner().invoke, main, [*args, argv[0], group, *argv[1:], "--tenant", TENANT]
    )
    pending = asyncio.create_task(invoke)
    _, request = await writer.request_for(group)
    assert (request.action, request.member_ids, request.role) == expected
    assert (request.actor, request.as_member) == ("alice", True)
    denied = Error(code=ErrorCode.PERMISSION_DENIED, detail="role_may_not_transfer")
    await writer.reply(request, error=denied)
    result = await pending
    assert result.exit_code == 1, result.output
    assert "PERMISSION_DENIED" in result.output


async def test_requests_need_the_secret_and_well_formed_input(server: GroupAdminServer) -> None:
    with pytest.raises(AdminHttpError) as info:
        await asyncio.to_thread(http(server, "wrong-secret-0123456789").show, TENANT, gid())
    assert info.value.status == 401
    with pytest.raises(AdminHttpError) as info:
        await asyncio.to_thread(http(server).create, TENANT, "team", "alice")
    assert info.value.status == 400 and "group id" in info.value.body["detail"]
    with pytest.raises(AdminHttpError) as info:
        await asyncio.to_thread(http(server).add, TENANT, gid(), [])
    assert info.value.status == 400


# -- end to end: the real ConversationWriter, a routing gateway, the SDK -----------------------

WRITER_ENV = {  # a 6 s lease keeps a first start short (spec 19.2.2 ties two timings to it)
    "QIM_SHARD_LEASE_TTL": "6000",
    "QIM_WRITER_SELF_FENCE_DEADLINE": "4800",
    "QIM_WRITER_LEASE_RENEW_INTERVAL": "2000",
}


async def writer_serving(worker: FaustWorker, within: float = 120.0) -> None:
    """Wait until the worker's ConversationWriter serves every conversation partition."""
    wanted = set(range(CONVERSATION_PARTITION_COUNT))

    def serving() -> bool:
        try:
            return wanted <= set(worker.get("/writer").get("serving", ()))
        except OSError:  # urllib's HTTPError (503 until started) included
            return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(serving):
        assert loop.time() < deadline, f"writer not serving in {within}s\n{worker.log_tail()}"
        await asyncio.sleep(0.25)


async def test_end_to_end_admin_group_sdk_send_history_and_a_direct_send(
    stack: Stack, tmp_path: Path
) -> None:
    """Admin creates a group; the SDK sends through a routing gateway to the real writer, reads
    the message back with PULL_HISTORY, and sends one-to-one with send_direct."""
    worker = FaustWorker(stack, "qim.apps.conversation", tmp_path / "writer", WRITER_ENV)
    await asyncio.to_thread(worker.start)
    try:
        await writer_serving(worker)
        tenant, group = f"t-e2e-{uuid.uuid4().hex[:6]}", gid()
        admin = await serve(stack, timeout_s=WAIT_S)
        try:
            created = await asyncio.to_thread(http(admin).create, tenant, group, "alice", ["bob"])
            shown = await asyncio.to_thread(http(admin).show, tenant, group)
            with pytest.raises(AdminHttpError) as missing:
                await asyncio.to_thread(http(admin).show, tenant, gid())
        finally:
            await admin.close()
        assert created["member_count"] == 2 and created["membership_version"] >= 1
        assert (shown["member_count"], shown["membership_version"]) == (
            created["member_count"],
            created["membership_version"],
        )
        assert missing.value.status == 403  # unknown group: PERMISSION_DENIED
        async with (
            gateway(stack, "gw-e2e") as gw,
            online(gw, "alice", tenant=tenant) as alice,
            online(gw, "bob", tenant=tenant) as bob,
        ):
            ack = await alice.send_message(group, b"hello team", client_message_id="e2e-1")
            assert ack.client_message_id == "e2e-1" and ack.conversation_seq >= 1
            history = await bob.pull_history(group, limit=10)
            sent = [m for m in history.messages if m.client_message_id == "e2e-1"]
            assert len(sent) == 1 and sent[0].conversation_seq == ack.conversation_seq
            assert sent[0].payload_or_ciphertext == b"hello team"
            assert (sent[0].sender_id, sent[0].sender_device_id) == ("alice", "phone")
            assert history.latest_conversation_seq >= ack.conversation_seq
            members = await bob.pull_members(group)
            assert {m.user_id for m in members.members} == {"alice", "bob"}
            alice.identity = Identity(tenant, "alice")
            direct = await alice.send_direct("carol", b"psst", client_message_id="e2e-d")
            assert direct.conversation_seq >= 1
            again = await alice.send_direct("carol", b"psst", client_message_id="e2e-d")
            same = msgspec.structs.replace(again, request_id=direct.request_id)
            assert same == direct  # ClientDedup: the same ack for the retry (spec 8)
            mine = await alice.pull_history(direct_conversation_id(tenant, "carol", "alice"))
            assert [m.payload_or_ciphertext for m in mine.messages] == [b"psst"]
            with pytest.raises(QimError) as info:
                await bob.send_direct("carol", b"x", tenant_id=tenant, user_id="mallory")
            assert info.value.code is ErrorCode.PERMISSION_DENIED  # not bob's conversation
    finally:
        await asyncio.to_thread(worker.stop)


def _raw(
    server: GroupAdminServer, method: str, path: str, body: bytes | None, secret: str | None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Qim-Admin-Secret"] = secret
    request = urllib.request.Request(server.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_the_openapi_document_is_served_without_the_secret_and_equals_the_committed_one(
    server: GroupAdminServer,
) -> None:
    status, served = await asyncio.to_thread(_raw, server, "GET", "/v1/openapi.json", None, None)
    assert status == 200
    assert served == json.loads(COMMITTED.read_text())
    assert "/v1/groups/{group_id}/members/{user_id}/role" in served["paths"]


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b'{"tenant_id": "t", "group_id": "g:x", "owner_id": "alice", "colour": 1}', "colour"),
        (b'{"tenant_id": "t", "group_id": "g:x", "owner_id": 7}', "owner_id"),
        (b'{"tenant_id": "t", "group_id": "g:x"}', "owner_id"),
        (b'{"tenant_id": "", "group_id": "g:x", "owner_id": "alice"}', "tenant_id"),
        (
            b'{"tenant_id": "t", "group_id": "g:x", "owner_id": "a", "member_ids": [""]}',
            "member_ids",
        ),
        (b"[1, 2]", "object"),
        (b"not json", "JSON"),
    ],
)
async def test_a_body_the_models_refuse_is_a_400_naming_the_field(
    server: GroupAdminServer, body: bytes, names: str
) -> None:
    """The handlers decode with the same structs the OpenAPI document is generated from."""
    status, answer = await asyncio.to_thread(_raw, server, "POST", "/v1/groups", body, SECRET)
    assert status == 400 and answer["error"] == "bad_request"
    assert names in answer["detail"], answer
