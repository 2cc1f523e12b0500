"""``login_and_sync`` (the SDK) against a real ConnectionNode and the fake MailboxNode.

Invariants (spec 6.8, 9.3, 9.6.3): every entry in ``(cursor, sync_to_seq]`` is pulled exactly
once, by pipelined sub-ranges, and the cursor returned is contiguous and carries the server's
token; a saved cursor pulls only what is new; CURSOR_EXPIRED goes through the REBUILD
re-handshake ``(token, 0)`` and ends at that AUTH_OK's ``sync_to_seq``; SHARD_MOVED at AUTH is
retried after ``retry_after_ms``; the top-up pull after ONLINE_READY catches an entry that
materialized during the login.
"""

from __future__ import annotations

from typing import Any

import pytest

from qim.client import (
    DeviceCursor,
    HeartbeatConfig,
    QimClient,
    QimError,
    SyncResult,
    login_and_sync,
)
from qim.client.state import ClientState
from qim.schemas.frames import Error, ErrorCode
from qim.schemas.records.user_requests import PullMailboxRequest, SyncAuthRequest
from tests.unit.gateway.test_login_sync_support import FakeMailbox, SyncNode, sync_node


def new_client() -> QimClient:
    return QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=5)


async def sync(h: SyncNode, user: str, cursor: DeviceCursor | None = None, **kw: Any) -> SyncResult:
    return await login_and_sync(new_client(), h.url, h.token(user), "phone", cursor, **kw)


def pulls(h: SyncNode) -> list[PullMailboxRequest]:
    return [r for _, r in h.producer.user_requests() if isinstance(r, PullMailboxRequest)]


def auths(h: SyncNode) -> list[SyncAuthRequest]:
    return [r for _, r in h.producer.user_requests() if isinstance(r, SyncAuthRequest)]


async def test_a_new_device_pulls_everything_once_in_pipelined_sub_ranges() -> None:
    mailbox = FakeMailbox()
    mailbox.add("bob", *range(10, 12_010, 10))  # 1200 entries > pull_mailbox_max_items (500)
    async with sync_node(mailbox) as h:
        result = await sync(h, "bob")
        try:
            assert [e.mailbox_seq for e in result.entries] == list(range(10, 12_010, 10))
            assert result.auth_ok.has_offline and result.auth_ok.sync_to_seq == 12_000
            assert result.cursor.last_applied_mailbox_seq == 12_000
            assert result.cursor.token == result.auth_ok.mailbox_cursor_token != b""
            assert not result.rebuild_required and result.attempts == 1
            assert result.client.state is ClientState.AUTHENTICATED
            assert result.client.last_applied_mailbox_seq == 12_000
            first = {p.message.after_seq for p in pulls(h)[:4]}
            assert len(first) == 4  # four sub-ranges went out before any answer was applied
            assert all(p.message.acked_seq == 0 for p in pulls(h))
            labels = {"result": "online_ready"}
            assert h.sample("qim_gateway_sync_complete_total", **labels) == 1
        finally:
            await result.client.close()


async def test_a_saved_cursor_pulls_only_what_is_new() -> None:
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20)
    async with sync_node(mailbox) as h:
        first = await sync(h, "bob")
        await first.client.close()
        again = await sync(h, "bob", first.cursor)
        await again.client.close()
        assert not again.auth_ok.has_offline and again.entries == []
        assert again.cursor.last_applied_mailbox_seq == 20
        assert auths(h)[-1].cursor is not None
        mailbox.add("bob", 35)
        third = await sync(h, "bob", again.cursor)
        await third.client.close()
        assert [e.mailbox_seq for e in third.entries] == [35]
        assert pulls(h)[-2].message.acked_seq == 20  # the position persisted before this login
        assert third.cursor.last_applied_mailbox_seq == 35


async def test_an_expired_cursor_rebuilds_through_the_empty_cursor_handshake() -> None:
    """9.6.3 step 0: re-AUTH with (token, 0) -> has_offline=false -> cursor := sync_to_seq."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10, 20)
    async with sync_node(mailbox) as h:
        first = await sync(h, "bob", top_up=False)
        await first.client.close()
        stale = DeviceCursor(first.cursor.token, 10)
        mailbox.add("bob", 30, 40)
        mailbox.trim["bob"] = 25
        result = await sync(h, "bob", stale, top_up=False)
        await result.client.close()
        assert result.attempts == 2 and result.rebuild_required
        assert not result.auth_ok.has_offline and result.entries == []
        assert result.cursor.last_applied_mailbox_seq == result.auth_ok.sync_to_seq == 40
        rehandshake = auths(h)[-1].cursor
        assert rehandshake is not None and rehandshake.last_applied_mailbox_seq == 0
        result.sync.rebuild_done()
        assert not result.sync.cursor.rebuild_pending


async def test_shard_moved_at_auth_is_retried_after_its_delay() -> None:
    mailbox = FakeMailbox()
    mailbox.add("bob", 10)
    moved = Error(code=int(ErrorCode.SHARD_MOVED), retry_after_ms=20, detail="catching up")
    mailbox.refuse_auth.append(moved)
    async with sync_node(mailbox) as h:
        result = await sync(h, "bob")
        await result.client.close()
        assert result.attempts == 2 and [e.mailbox_seq for e in result.entries] == [10]


async def test_a_verdict_another_auth_cannot_fix_is_raised() -> None:
    mailbox = FakeMailbox()
    mailbox.refuse_auth.extend([Error(code=int(ErrorCode.SHARD_MOVED), retry_after_ms=1)] * 2)
    async with sync_node(mailbox) as h:
        with pytest.raises(QimError) as info:
            await sync(h, "bob", max_attempts=2)
        assert info.value.code is ErrorCode.SHARD_MOVED


async def test_the_top_up_pull_catches_an_entry_materialized_during_the_login() -> None:
    """The digest's login race: an entry above sync_to_seq, before presence, is pulled once."""
    mailbox = FakeMailbox()
    mailbox.add("bob", 10)

    def late(request: PullMailboxRequest) -> None:
        if request.message.up_to_seq == 10:  # the login's own pull: W moves on meanwhile
            mailbox.add("bob", 15)

    mailbox.after_pull = late
    async with sync_node(mailbox) as h:
        result = await sync(h, "bob")
        await result.client.close()
        assert [e.mailbox_seq for e in result.entries] == [10, 15]
        assert result.auth_ok.sync_to_seq == 10 and result.cursor.last_applied_mailbox_seq == 15
        assert pulls(h)[-1].message.up_to_seq == 0  # the top-up: up to the current W
