"""ConnectionNode wiring over a real loopback WebSocket, without Kafka or Redis: presence
records in memory, the in-process authenticator (§5.4.2, §5.3.2, §15.2.3)."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus

from qim.gateway.auth_memory import MemoryAuthenticator
from qim.gateway.ports import AuthGrant, AuthRequest, RouteToken
from qim.gateway.presence_writer import MemoryPresence
from qim.params import Settings
from qim.schemas.frames import Error, ErrorCode, Kicked
from qim.schemas.records.presence import PresenceKey
from tests.gateway_support import memory_mint, running_gateway, wait_until


async def test_presence_upserts_and_tombstones_follow_the_device_rules() -> None:
    presence = MemoryPresence()
    async with running_gateway(presence=presence) as gw:
        old, first = await gw.online("u1", "phone")
        new, second = await gw.online("u1", "phone")  # replacement: same key, larger epoch
        assert await old.expect_closed() == [Kicked(reason="replaced", replaced_by_device="phone")]
        key = PresenceKey("t1", "u1", "phone")
        assert presence.entries[key].session_epoch == second.session_epoch > first.session_epoch
        assert (key, None) not in presence.log  # the kicked one must not tombstone its successor
        await new.close()
        await wait_until(lambda: key not in presence.entries)
        assert presence.log[-1] == (key, None)


async def test_the_evicted_ninth_device_is_tombstoned() -> None:
    presence = MemoryPresence()
    settings = Settings.load(overrides={"max_devices_per_user": 2}, env={})
    async with running_gateway(presence=presence, settings=settings) as gw:
        a, _ = await gw.online("u1", "a")
        b, _ = await gw.online("u1", "b")
        await b.ping()  # a is the least recently active
        c, _ = await gw.online("u1", "c")
        assert await a.expect_closed() == [Kicked(reason="replaced", replaced_by_device="c")]
        assert set(presence.entries) == {PresenceKey("t1", "u1", d) for d in ("b", "c")}
        for client in (b, c):
            await client.close()


async def test_losing_a_shard_answers_shard_moved_without_tombstones() -> None:
    presence = MemoryPresence()
    async with running_gateway(presence=presence) as gw:
        client, _ = await gw.online("u1", "phone")
        gw.node.drop_shards({gw.node.logins.shard_of("t1", "u1")})
        (moved,) = await client.expect_closed()
        assert isinstance(moved, Error) and moved.code == int(ErrorCode.SHARD_MOVED)
        assert moved.retry_after_ms
        assert all(value is not None for _key, value in presence.log)  # expires by lease


class BrokenAuth(MemoryAuthenticator):
    async def authenticate(self, request: AuthRequest) -> AuthGrant:
        raise ConnectionError("redis unreachable")

    async def issue_route_token(
        self, grant: AuthGrant, connection_shard: int, now_ms: int
    ) -> RouteToken | None:
        return None


async def test_an_auth_backend_failure_is_rate_limited_not_the_clients_fault() -> None:
    auth = BrokenAuth()
    async with running_gateway(authenticator=auth, mint=memory_mint(auth)) as gw:
        client = await gw.ws()
        await client.login(await gw.token("u1", "d1"), "d1")
        (error,) = await client.refusal()
        assert isinstance(error, Error) and error.code == int(ErrorCode.RATE_LIMITED)
        assert error.retry_after_ms is not None and 700 <= error.retry_after_ms <= 1300


async def test_per_ip_connect_rate_refuses_the_upgrade_without_an_app_frame() -> None:
    rate = {"count": 2, "period_ms": 60_000}
    settings = Settings.load(overrides={"per_ip_connect_rate": rate}, env={})
    async with running_gateway(settings=settings) as gw:
        first, second = await gw.ws(), await gw.ws()
        with pytest.raises(InvalidStatus) as info:
            await gw.ws()
        assert info.value.response.status_code == 429
        assert gw.node.admission.connections("127.0.0.1") == 2
        for client in (first, second):
            await client.close()
        await wait_until(lambda: gw.node.admission.connections("127.0.0.1") == 0)
