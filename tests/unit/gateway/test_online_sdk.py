"""The SDK once online (issue 6): reconnecting with the previous login's MailboxSync, and
:func:`~qim.client.catch_up` (the 6.10.1 / 15.1.1 pull rule), against a real ConnectionNode
and the fake MailboxNode of the login-sync tests.

Invariants: a device whose connection dropped logs in again with its MailboxSync (cursor and
dedup memory) and gets only what is new; an online device pulls only when the PONG says so or
the user asks, never on a quiet mailbox.
"""

from __future__ import annotations

from qim.client import HeartbeatConfig, MailboxSync, QimClient, catch_up, login_and_sync
from qim.schemas.records.user_requests import PullMailboxRequest
from tests.unit.gateway.test_login_sync_support import FakeMailbox, SyncNode, sync_node


def new_client() -> QimClient:
    return QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=5)


def pulls(h: SyncNode) -> list[PullMailboxRequest]:
    return [r for _, r in h.producer.user_requests() if isinstance(r, PullMailboxRequest)]


async def test_a_dropped_device_logs_in_again_with_its_mailbox_sync() -> None:
    mailbox = FakeMailbox()
    mailbox.add("bob", 10)
    async with sync_node(mailbox) as h:
        first = await login_and_sync(new_client(), h.url, h.token("bob"), "phone")
        await first.client.close()  # the link drops while the SDK state is ONLINE
        mailbox.add("bob", 20)
        again = await login_and_sync(new_client(), h.url, h.token("bob"), "phone", sync=first.sync)
        await again.client.close()
        assert [e.mailbox_seq for e in again.entries] == [20]
        assert again.cursor.last_applied_mailbox_seq == 20


async def test_catch_up_pulls_only_when_asked_or_told() -> None:
    mailbox = FakeMailbox()
    mailbox.add("bob", 10)
    async with sync_node(mailbox) as h:
        state = MailboxSync(resync_min_interval_ms=0)  # no rate limit in the way here
        result = await login_and_sync(new_client(), h.url, h.token("bob"), "phone", sync=state)
        try:
            mailbox.add("bob", 20)  # materialized, never pushed
            asked = len(pulls(h))
            assert await catch_up(result) == []  # PONG: nothing pushed beyond the cursor
            assert len(pulls(h)) == asked
            got = await catch_up(result, user_refresh=True)
            assert [e.mailbox_seq for e in got] == [20]
            assert pulls(h)[-1].message.after_seq == 10 and pulls(h)[-1].message.up_to_seq == 0
            assert result.sync.cursor.last_applied_mailbox_seq == 20
            assert result.client.last_applied_mailbox_seq == 20
        finally:
            await result.client.close()
