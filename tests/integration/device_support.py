"""SDK devices in end-to-end tests: log in and sync, follow pushed frames, poll, drain.

Shared by the session-list, recall and conversation-state proofs: a device's frames are applied
as they arrive (``follow``), so its local session list is what the user would see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from qim.client import Identity, QimClient, SyncResult, login_and_sync
from qim.schemas.frames import PushEvents
from tests.gateway_support import Gateway
from tests.integration.login_support import new_client

WAIT_S = 90.0


async def login(gw: Gateway, tenant: str, user: str, device: str) -> SyncResult:
    token = await gw.token(user, device, tenant)
    result = await login_and_sync(new_client(), gw.ws_url, token, device)
    result.client.identity = Identity(tenant, user)
    return result


async def follow(result: SyncResult, until: object, what: str) -> list[object]:
    """Consume the device's events (pushes advance its mailbox position) until ``until()``."""
    client: QimClient = result.client
    bodies: list[object] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not until():  # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting for {what}"
        try:
            frame = await client.next_event(timeout=0.5)
        except TimeoutError:
            continue
        bodies.append(frame.body)
        if isinstance(frame.body, PushEvents):
            fresh = result.on_push(frame.body)
            seqs = [e.mailbox_seq for e in fresh] + [result.sync.cursor.last_applied_mailbox_seq]
            client.applied(max(seqs))
    return bodies


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


async def drain(client: QimClient) -> list[object]:
    """The events queued so far (and any arriving within a second)."""
    out: list[object] = []
    while True:
        try:
            out.append((await client.next_event(timeout=1.0)).body)
        except TimeoutError:
            return out
