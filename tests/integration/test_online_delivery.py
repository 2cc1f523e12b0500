"""Online delivery on the real stack (issue 6): offline devices, a replaced device, a login
during traffic. The setup of ``test_push_delivery`` (real conversation and mailbox workers, a
syncing gateway, the SDK over WebSocket); the gateway-killed case is in
``test_online_gateway_kill``.

Spec: 11.1 / 11.1.1 (PushBatch expansion: one event per online device; a connection whose
epoch does not match is never written), 11.1.2 (push is best effort, the mailbox is the
truth: an offline device pulls), 5.4.4 / 15.2.2 (the larger session_epoch replaces the same
device, the loser gets KICKED), 9.4.1 (nothing is pushed before ONLINE_READY; events up to
``sync_to_seq`` are pulled), 6.9.1 (conversation_seq orders a conversation), 15.1.1 (the
device pulls when ``cursor < PONG.last_pushed_user_seq``).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from qim.client import Identity
from qim.devstack.stack import Stack
from qim.schemas.frames import Frame, OnlineReady, PushEvents, SyncEntry
from tests.integration.login_support import (
    FrameRecorder,
    from_alice,
    from_sender,
    materialized,
    new_client,
    pipeline,
    syncing_gateway,
)
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.online_support import (
    PushWatch,
    Traffic,
    barrier,
    connect,
    online,
    presence_log,
    until,
    warm_up,
)

pytestmark = pytest.mark.integration


def once_each(entries: Sequence[SyncEntry]) -> dict[bytes, SyncEntry]:
    """The entries by message_id; fails if a (message_id, event_id) appears twice."""
    keys = [(e.message_id, e.event_id) for e in entries]
    assert len(keys) == len(set(keys)), "a duplicate survived the SDK's dedup"
    return {e.message_id: e for e in entries}


async def test_each_online_device_gets_a_message_once_and_the_offline_one_pulls_it(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-online-{uuid.uuid4().hex[:6]}", f"g:online-{uuid.uuid4().hex[:8]}"
    async with (
        pipeline(stack, tmp_path),
        syncing_gateway(stack, "gw-online") as gw,
        online(gw, tenant, "alice", "phone") as alice,
        online(gw, tenant, "bob", "phone") as bob_phone,
    ):
        sender = alice.result.client
        await sender.create_group(group, ("bob",))
        bob = Identity(tenant, "bob")
        tablet = await connect(gw.ws_url, await gw.token("bob", "tablet", tenant), bob, "tablet")
        warm = await warm_up(
            lambda i: sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}"),
            (bob_phone, tablet),
        )
        await tablet.close()  # bob's tablet goes offline; his phone stays

        sent: dict[bytes, bytes] = {}
        for i in range(3):
            ack = await sender.send_message(group, f"g{i}".encode(), client_message_id=f"g{i}")
            sent[ack.message_id] = f"g{i}".encode()
        for i in range(2):
            ack = await sender.send_direct("bob", f"d{i}".encode(), client_message_id=f"d{i}")
            sent[ack.message_id] = f"d{i}".encode()

        # every online device is pushed each message once (alice: her echo)
        online_devices = (alice, bob_phone)
        await until(lambda: all(d.of(m) for d in online_devices for m in sent), "not pushed")
        # a later message in each conversation pushed to every online device: a duplicate of
        # an earlier one would have reached the socket first (online_support.barrier)
        later = await barrier(
            online_devices,
            sender.send_message(group, b"b0", client_message_id="b0"),
            sender.send_direct("bob", b"b1", client_message_id="b1"),
        )
        for device in online_devices:
            for mid, payload in sent.items():
                got = device.of(mid)
                assert len(got) == 1 and got[0].payload_or_ciphertext == payload, got

        # the tablet comes back with its own cursor and SDK state: PULL_MAILBOX brings
        # exactly what it missed (the phone was pushed all of it, so the login's sync_to_seq
        # covers it), nothing it was pushed before is handed over again
        token = await gw.token("bob", "tablet", tenant)
        back = await connect(gw.ws_url, token, bob, "tablet", sync=tablet.result.sync)
        try:
            assert back.result.auth_ok.has_offline
            pulled = once_each(from_alice(back.result.entries))
            assert set(sent) <= set(pulled)  # (and warm-ups never pushed to the tablet)
            assert {m: pulled[m].payload_or_ciphertext for m in sent} == sent
            assert all(e.mailbox_seq <= back.result.auth_ok.sync_to_seq for e in pulled.values())
            # pulled, not pushed as well: the pushes of later messages of both conversations
            # reached the new connection, so a push of the pulled ones would have come first
            later += await barrier(
                (back,),
                sender.send_message(group, b"b2", client_message_id="b2"),
                sender.send_direct("bob", b"b3", client_message_id="b3"),
            )
            assert not any(back.of(m) for m in sent)

            # after dedup no device holds a message twice; each holds all it should (the
            # tablet went offline before the barriers: the new connection pulled or was
            # pushed each of them)
            everything = once_each(from_alice([*tablet.delivered, *back.delivered]))
            assert len(everything) == warm + len(sent) + len(later)
            for device in online_devices:
                delivered = once_each(from_alice(device.delivered))
                assert set(sent) <= set(delivered)
        finally:
            await back.close()


async def test_a_replaced_device_gets_nothing_after_kicked_and_pushes_follow_the_new_epoch(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-replace-{uuid.uuid4().hex[:6]}", f"g:replace-{uuid.uuid4().hex[:8]}"
    bootstrap = stack.cfg.kafka.bootstrap
    alice = Identity(tenant, "alice")
    async with (
        pipeline(stack, tmp_path) as mailbox,
        PushWatch(bootstrap) as watch,
        syncing_gateway(stack, "gw-replace") as gw,
        online(gw, tenant, "bob", "laptop") as bob,
    ):
        old = await connect(gw.ws_url, await gw.token("alice", "phone", tenant), alice, "phone")
        sender = bob.result.client
        await sender.create_group(group, ("alice",))
        await warm_up(
            lambda i: sender.send_message(group, f"w{i}".encode(), client_message_id=f"w{i}"),
            (old,),
        )
        traffic = Traffic(sender, group, tag="s")
        traffic.start()
        await traffic.sent_more_than(3)

        # the same device logs in again on another connection, mid-stream
        token = await gw.token("alice", "phone", tenant)
        new = await connect(gw.ws_url, token, alice, "phone", cursor=old.cursor)
        try:
            old_epoch = old.result.auth_ok.session_epoch
            new_epoch = new.result.auth_ok.session_epoch
            assert new_epoch > old_epoch
            await until(lambda: old.closed, "the replaced connection was not closed")
            assert old.kicked is not None and old.kicked.reason == "replaced"
            assert old.kicked.replaced_by_device == "phone"
            assert old.after_kick == []  # KICKED was its last frame

            # once the MailboxNode knows the new epoch, messages are planned for it alone
            await until(lambda: bool(new.entries), "the new connection was never pushed")
            mark = len(traffic.acks)
            await traffic.sent_more_than(mark + 4)
            acks = await traffic.stop()
            later = list(acks)[mark:]
            await until(lambda: all(new.of(m) for m in later), "not pushed to the new epoch")
            # a later group message pushed to the new connection, then the watch read up to
            # the end of qim.to-gateway: alice's MailboxNode enqueued every PushBatch of
            # `later` (for any epoch) before that one, so each is in the watch by now
            await barrier((new,), sender.send_message(group, b"b0", client_message_id="b0"))
            await watch.caught_up()
            for mid in later:
                assert len(new.of(mid)) == 1
                mine = [r for r in watch.recipients(mid) if r.user_id == "alice"]
                assert [(r.device_id, r.session_epoch) for r in mine] == [("phone", new_epoch)]

            # the presence topic: the new entry was never tombstoned nor overwritten by the
            # replaced connection (its close releases no key it no longer holds)
            log = await presence_log(bootstrap, tenant, "alice", "phone")
            first_new = next(i for i, e in enumerate(log) if e and e.session_epoch == new_epoch)
            assert all(e is not None and e.session_epoch == new_epoch for e in log[first_new:])
            assert any(e is not None and e.session_epoch == old_epoch for e in log[:first_new])

            # nothing is lost for the device: the new connection holds every message once
            await new.holds(acks)
            delivered = once_each(from_sender(new.delivered, "bob"))
            assert set(acks) <= set(delivered)
            totals = mailbox.totals()
            print(
                "PRESENCE_STALE at the MailboxNode:",
                {k: v for k, v in totals.items() if k.startswith("presence_stale")},
            )
        finally:
            await traffic.stop()
            await old.close()
            await new.close()


async def test_a_login_during_traffic_gets_everything_once_and_no_push_before_online_ready(
    stack: Stack, tmp_path: Path
) -> None:
    tenant, group = f"t-busy-{uuid.uuid4().hex[:6]}", f"g:busy-{uuid.uuid4().hex[:8]}"
    async with (
        pipeline(stack, tmp_path),
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-busy") as gw,
        online(gw, tenant, "alice", "phone") as alice,
    ):
        sender = alice.result.client
        await sender.create_group(group, ("bob", "carol"))
        traffic = Traffic(sender, group, peer="bob", tag="m")
        traffic.start()
        try:
            await materialized(probe, tenant, "bob", 4)  # bob has something to pull
            recorder = FrameRecorder()
            token = await gw.token("bob", "phone", tenant)
            client = new_client(recorder)
            bob = await connect(gw.ws_url, token, Identity(tenant, "bob"), "phone", client=client)
            try:
                await until(lambda: len(bob.entries) >= 4, "no pushes after ONLINE_READY")
                acks = await traffic.stop()
                await bob.holds(acks)
                # a later message in both conversations pushed: a late duplicate push of an
                # earlier one would have reached the socket first (online_support.barrier)
                later = await barrier(
                    (bob,),
                    sender.send_message(group, b"b0", client_message_id="b0"),
                    sender.send_direct("bob", b"b1", client_message_id="b1"),
                )
                await bob.catch_up()
                received = [f for f in recorder.received() if isinstance(f, Frame)]
            finally:
                await bob.close()
        finally:
            await traffic.stop()

    ok = bob.result.auth_ok
    assert ok.has_offline and from_alice(bob.result.entries)

    # exactly once after the SDK's dedup, at the conversation_seq the writer acknowledged
    got = once_each(from_alice(bob.delivered))
    assert set(got) == set(acks) | set(later)
    per_conversation: dict[str, list[SyncEntry]] = defaultdict(list)
    for mid, (payload, ack) in acks.items():
        entry = got[mid]
        assert entry.conversation_seq == ack.conversation_seq
        assert entry.payload_or_ciphertext == payload.encode()
        per_conversation[entry.conversation_id].append(entry)
    assert len(per_conversation) == 2  # the group and the direct conversation
    for entries in per_conversation.values():  # sent one by one: seq follows sending order
        seqs = [e.conversation_seq for e in entries]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    # the wire, in arrival order: no PUSH_EVENTS before ONLINE_READY, nothing pushed at or
    # below sync_to_seq (that range is the pull's), pushes in conversation_seq order
    ready = next(i for i, f in enumerate(received) if isinstance(f.body, OnlineReady))
    assert not any(isinstance(f.body, PushEvents) for f in received[:ready])
    pushed = [e for f in received if isinstance(f.body, PushEvents) for e in f.body.events]
    assert pushed and all(e.mailbox_seq > ok.sync_to_seq for e in pushed)
    by_conversation: dict[str, list[int]] = defaultdict(list)
    for entry in from_alice(pushed):
        by_conversation[entry.conversation_id].append(entry.conversation_seq)
    for seqs in by_conversation.values():
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
