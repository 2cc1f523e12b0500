"""RECALL / EDIT through a real ConversationWriter worker and Kafka (spec 13.4, AT-57, AT-62).

Requests are produced to ``qim.conversation-requests`` the way the gateway does
(``writer_support``); replies are read read_committed from ``qim.to-gateway``; the outbox is read
back to count CONTROL events. The last test goes through a routing gateway with the SDK.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from qim.client import QimError
from qim.core.history import AMEND_CUSTOM_TYPE, AmendControl, MessageState
from qim.core.keys import is_sealed
from qim.devstack.stack import Stack
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import (
    AmendRequest,
    MessageAmended,
    WriterReply,
    conversation_partition,
)
from qim.schemas.records.membership import MESSAGE_TYPE_CONTROL
from tests.integration.test_gateway_routing import gateway, online
from tests.integration.writer_support import Client, create_group, read_outbox, send, shard_of
from tests.integration.writer_workers import Workers

pytestmark = pytest.mark.integration

_ids = iter(range(10_000_000, 20_000_000))


@pytest.fixture(scope="module")
async def workers(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Workers]:
    pool = Workers(stack, tmp_path_factory.mktemp("amend-writers"))
    try:
        yield pool
    finally:
        await pool.stop_all()


@pytest.fixture(scope="module")
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with Client(stack.cfg.kafka.bootstrap) as c:
        yield c


def amend(
    tenant: str, user: str, conversation_id: str, seq: int, payload: bytes | None = None
) -> AmendRequest:
    """RECALL (``payload`` None) or EDIT, as the gateway's routing builds it."""
    return AmendRequest(
        tenant_id=tenant,
        user_id=user,
        device_id="dev",
        session_epoch=1,
        connection_shard=shard_of(user),
        request_id=next(_ids),
        action="recall" if payload is None else "edit",
        conversation_id=conversation_id,
        target_conversation_seq=seq,
        new_payload=payload or b"",
    )


def ack(reply: WriterReply) -> tuple[bytes, int, bytes]:
    assert reply.send_ack is not None, reply
    assert reply.send_ack.client_message_id == ""
    return (
        reply.send_ack.message_id,
        reply.send_ack.conversation_seq,
        reply.send_ack.last_activity_id,
    )


def code(reply: WriterReply) -> ErrorCode:
    assert reply.error is not None, reply
    return ErrorCode(reply.error.code)


async def test_recall_and_edit_end_to_end(workers: Workers, client: Client) -> None:
    """13.4.1: own seq + SEND_ACK; history shows the state and the CONTROL row; 13.4.4: a
    double-tap recall is one CONTROL event; 13.4.3: a non-sender non-admin is refused."""
    await workers.ensure_primary()
    tenant, group = f"t-{uuid.uuid4().hex[:10]}", "g:amend"
    await client.call(create_group(tenant, "alice", group, ["bob", "carol"]))
    first = await client.call(send(tenant, "bob", group, "m1", payload=b"oops"))
    assert first.send_ack is not None and first.send_ack.conversation_seq == 2  # the create is 1

    refused = await client.call(amend(tenant, "carol", group, 2))
    assert code(refused) == ErrorCode.PERMISSION_DENIED

    taps = [amend(tenant, "bob", group, 2), amend(tenant, "bob", group, 2)]
    await client.send(taps)  # usually decided in one batch: the batch is cut between them
    recalled, tapped = (ack(r) for r in await client.wait(taps))
    assert recalled[1] == 3 and tapped == recalled  # the CONTROL event's own seq, once
    assert ack(await client.call(amend(tenant, "bob", group, 2))) == recalled  # a later retry

    history = {m.conversation_seq: m for m in await client.history(tenant, "carol", group)}
    target, control = history[2], history[3]
    assert target.state == MessageState.RECALLED and target.payload_or_ciphertext is None
    assert target.recall_event_conversation_seq == 3
    assert (control.message_id, control.conversation_seq, control.last_activity_id) == recalled
    assert (control.message_type, control.custom_type) == (MESSAGE_TYPE_CONTROL, AMEND_CUSTOM_TYPE)
    assert control.sender_id == "bob" and control.payload_or_ciphertext is not None
    body = msgspec.msgpack.decode(control.payload_or_ciphertext, type=AmendControl)
    assert (body.action, body.target_conversation_seq) == ("recall", 2)

    second = await client.call(send(tenant, "bob", group, "m2", payload=b"v1"))
    assert second.send_ack is not None and second.send_ack.conversation_seq == 4
    edited = ack(await client.call(amend(tenant, "bob", group, 4, b"v2")))
    assert edited[1] == 5
    too_big = await client.call(amend(tenant, "bob", group, 4, b"x" * (32 * 1024 + 1)))
    assert code(too_big) == ErrorCode.PAYLOAD_TOO_LARGE
    history = {m.conversation_seq: m for m in await client.history(tenant, "alice", group)}
    assert history[4].state == MessageState.EDITED
    assert history[4].payload_or_ciphertext == b"v2"
    assert history[4].recall_event_conversation_seq == 5

    by_owner = ack(await client.call(amend(tenant, "alice", group, 4)))  # OWNER: any message
    assert by_owner[1] == 6
    again = await client.call(amend(tenant, "bob", group, 4, b"v3"))
    assert code(again) == ErrorCode.PERMISSION_DENIED  # no edit after a recall

    records = await read_outbox(client.bootstrap, tenant, group)
    amends = [r for r in records if isinstance(r, MessageAmended)]
    assert [(a.action, a.target_conversation_seq, a.conversation_seq) for a in amends] == [
        ("recall", 2, 3),
        ("edit", 4, 5),
        ("recall", 4, 6),
    ]
    assert amends[0].target_sender_id == "bob" and amends[2].sender_id == "alice"
    # the outbox holds the edit's body sealed (topology.md decision 44); history opens it above
    assert is_sealed(amends[1].new_payload) and b"v2" not in amends[1].new_payload
    assert [a.repairs_preview for a in amends] == [True, True, True]  # each hit the head's preview


async def test_sdk_recall_and_edit_through_a_routing_gateway(
    stack: Stack, workers: Workers
) -> None:
    """The SDK's ``recall`` / ``edit`` over WebSocket: the gateway routes RECALL / EDIT to the
    writer and writes back its SEND_ACK, or its ERROR as ``QimError``."""
    await workers.ensure_primary()
    tenant, group = f"t-sdk-{uuid.uuid4().hex[:8]}", f"g:{uuid.uuid4().hex[:10]}"
    async with (
        gateway(stack, "gw-amend") as gw,
        online(gw, "alice", tenant=tenant) as alice,
        online(gw, "bob", tenant=tenant) as bob,
    ):
        await alice.create_group(group, ("bob",))
        sent = await alice.send_message(group, b"draft", client_message_id="a1")
        with pytest.raises(QimError) as denied:
            await bob.recall(group, sent.conversation_seq)
        assert denied.value.code == ErrorCode.PERMISSION_DENIED
        edited = await alice.edit(group, sent.conversation_seq, b"final")
        assert edited.conversation_seq == sent.conversation_seq + 1
        assert edited.client_message_id == ""
        recalled = await alice.recall(group, sent.conversation_seq)
        assert recalled.conversation_seq == sent.conversation_seq + 2
        again = await alice.recall(group, sent.conversation_seq)  # 13.4.4: the same event
        assert (again.message_id, again.conversation_seq) == (
            recalled.message_id,
            recalled.conversation_seq,
        )
        with pytest.raises(QimError) as after:
            await alice.edit(group, sent.conversation_seq, b"again")
        assert after.value.code == ErrorCode.PERMISSION_DENIED
        batch = await bob.pull_history(group)
        rows = {m.conversation_seq: m for m in batch.messages}
        assert rows[sent.conversation_seq].state == MessageState.RECALLED
        assert rows[sent.conversation_seq].payload_or_ciphertext is None
        assert rows[edited.conversation_seq].custom_type == AMEND_CUSTOM_TYPE


async def test_at_58_59_a_crash_around_the_append_then_a_retry_is_one_control_event(
    workers: Workers, client: Client
) -> None:
    """13.4.1 crash table: crash before the commit (the request is redone) and after the commit
    but before the MessageStore write (the restart catches the store up from the outbox, so the
    retry hits the 13.4.4 short-circuit): one CONTROL event per target, state RECALLED with
    ``recall_event_conversation_seq`` set, the retry acked with the first event."""
    machine = await workers.ensure_primary()
    tenant, group = f"t-{uuid.uuid4().hex[:10]}", "g:amend-crash"
    partition = conversation_partition(tenant, group, 16)
    await client.call(create_group(tenant, "alice", group, ["bob"]))
    steps = ("appended", "committed")
    for step in steps:
        await client.call(send(tenant, "bob", group, step))  # seqs 2 and 3 (the create: 1)
    await machine.stop()

    originals = {}
    for seq, step in enumerate(steps, start=2):
        env = {"QIM_WRITER_CRASH_AT": step, "QIM_WRITER_CRASH_CMID": f"amend:{group}:{seq}"}
        crasher = workers.new(env, workdir=machine.worker.workdir)
        await crasher.start()
        await crasher.serving([partition])
        originals[seq] = amend(tenant, "bob", group, seq)
        await client.send([originals[seq]])
        await crasher.exited()
    workers.primary = final = workers.new(workdir=machine.worker.workdir)
    await final.start()
    await final.serving([partition])

    first = [ack(r) for r in await client.wait(list(originals.values()))]
    retried = [ack(await client.call(amend(tenant, "bob", group, seq))) for seq in originals]
    assert retried == first
    records = await read_outbox(client.bootstrap, tenant, group)
    amends = [r for r in records if isinstance(r, MessageAmended)]
    assert sorted((a.target_conversation_seq, a.conversation_seq) for a in amends) == sorted(
        (seq, event[1]) for seq, event in zip(originals, first, strict=True)
    )
    history = {m.conversation_seq: m for m in await client.history(tenant, "alice", group)}
    for seq, event in zip(originals, first, strict=True):
        assert history[seq].state == MessageState.RECALLED
        assert history[seq].recall_event_conversation_seq == event[1]
