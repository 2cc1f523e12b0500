"""E2EE key distribution on the real stack (issue 23; spec 7.14, 22.2, A.3 #23-#24, A.6 #16).

Real pieces: Kafka, a `faust worker` of `qim.apps.keys` (the DevicePreKeyBundle table and its
changelog), two routing gateways with the SDK over WebSocket. Keys come from the SDK's
``DeviceKeys`` (Ed25519 / X25519 on ``cryptography``).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from qim.client import HeartbeatConfig, QimClient, QimError
from qim.client.e2ee import DeviceKeys, raw_public
from qim.core.e2ee.prekeys import signed_prekey_message
from qim.devstack.stack import CONVERSATION_PARTITION_COUNT, PREKEY_PARTITION_COUNT, Stack
from qim.gateway.ownership.shards import ShardOwnership
from qim.schemas.frames import Error, ErrorCode, PrekeyFetch, PrekeyFetchDown, SignedPreKey
from tests.gateway_support import Gateway, running_gateway
from tests.integration.test_gateway_routing import SETTINGS
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

STRICT = f"t-strict-{uuid.uuid4().hex[:6]}"
LOW_WATERMARK = 3
WAIT_S = 30.0


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def keys_worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaustWorker]:
    env = {
        "QIM_PREKEY_NO_FALLBACK_TENANTS": STRICT,
        "QIM_E2EE_PREKEY_LOW_WATERMARK": str(LOW_WATERMARK),
    }
    worker = FaustWorker(stack, "qim.apps.keys", tmp_path_factory.mktemp("keys"), env)
    worker.start()
    yield worker
    worker.stop()


@contextlib.asynccontextmanager
async def gateway(stack: Stack, name: str) -> AsyncIterator[Gateway]:
    bootstrap = stack.cfg.kafka.bootstrap
    ownership = ShardOwnership(bootstrap, f"qim-gw-keys-{uid('g')}", f"ws://{name}")
    await ownership.start()
    try:
        await asyncio.wait_for(ownership.wait_assigned(), 60)
        async with running_gateway(
            ownership=ownership,
            settings=SETTINGS,
            node_id=name,
            kafka_bootstrap=bootstrap,
            route_requests=True,
            conversation_partition_count=CONVERSATION_PARTITION_COUNT,
            prekeys=True,
            prekey_partition_count=PREKEY_PARTITION_COUNT,
        ) as gw:
            yield gw
    finally:
        await ownership.stop()


@pytest.fixture(scope="module")
async def gateways(
    stack: Stack, keys_worker: FaustWorker
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    async with gateway(stack, "gw-keys-1") as gw1, gateway(stack, "gw-keys-2") as gw2:
        yield gw1, gw2


@contextlib.asynccontextmanager
async def online(gw: Gateway, tenant: str, user: str, device: str) -> AsyncIterator[QimClient]:
    client = QimClient(heartbeat=HeartbeatConfig(enabled=False), request_timeout=WAIT_S)
    async with client:
        await client.connect(gw.ws_url, await gw.token(user, device, tenant), device)
        yield client


async def published(client: QimClient, keys: DeviceKeys) -> PrekeyFetchDown:
    return await client.publish_prekeys(keys.publish_frame())


def metric(worker: FaustWorker, line_prefix: str) -> float:
    """A sample of the key worker's /metrics; a missing series fails the test."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_prefix} not exported:\n{text}")


async def test_two_users_with_two_devices_publish_and_fetch_each_others_bundles(
    gateways: tuple[Gateway, Gateway],
) -> None:
    gw1, gw2 = gateways
    tenant, alice, bob = uid("t"), uid("alice"), uid("bob")
    keys = {name: DeviceKeys() for name in ("a-phone", "a-laptop", "b-phone", "b-laptop")}
    for k in keys.values():
        k.add_one_time(5)
    async with (
        online(gw1, tenant, alice, "phone") as a_phone,
        online(gw2, tenant, alice, "laptop") as a_laptop,
        online(gw1, tenant, bob, "phone") as b_phone,
        online(gw2, tenant, bob, "laptop") as b_laptop,
    ):
        clients = {
            "a-phone": a_phone, "a-laptop": a_laptop, "b-phone": b_phone, "b-laptop": b_laptop
        }  # fmt: skip
        for name, client in clients.items():
            status = await published(client, keys[name])
            (own,) = status.bundles
            assert own.device_id == name.split("-")[1]
            assert own.one_time_remaining == 5 and own.one_time_prekey is None
            assert own.identity_pub == keys[name].identity_pub

        got = await a_phone.fetch_prekeys(bob)
        assert [b.device_id for b in got.bundles] == ["laptop", "phone"]
        for bundle in got.bundles:
            mine = keys[f"b-{bundle.device_id}"]
            assert bundle.identity_pub == mine.identity_pub
            assert bundle.signed_prekey == mine.signed_prekey_frame()
            assert bundle.one_time_prekey is not None
            assert bundle.one_time_prekey.key_id == 1
            assert bundle.one_time_prekey.pub == raw_public(mine.one_time[1])
            assert not bundle.one_time_exhausted and bundle.one_time_remaining == 0

        back = await b_laptop.fetch_prekeys(alice, ("phone",))
        (only,) = back.bundles
        assert only.device_id == "phone" and only.one_time_prekey is not None
        assert only.one_time_prekey.key_id == 1
        # alice's own other device: her laptop sets up a session with her phone too (22.2)
        own_again = await a_laptop.fetch_prekeys(alice, ("phone",))
        assert own_again.bundles[0].one_time_prekey is not None
        assert own_again.bundles[0].one_time_prekey.key_id == 2
        nobody = await a_phone.fetch_prekeys(uid("nobody"))
        assert nobody.bundles == ()


async def test_concurrent_fetches_from_two_gateways_never_hand_out_the_same_one_time_prekey(
    gateways: tuple[Gateway, Gateway], keys_worker: FaustWorker
) -> None:
    gw1, gw2 = gateways
    tenant, carol = uid("t"), uid("carol")
    keys = DeviceKeys()
    keys.add_one_time(30)
    fallback = 'qim_prekey_fetch_bundles_total{kind="signed_prekey_fallback"}'
    async with (
        online(gw1, tenant, carol, "phone") as owner,
        online(gw1, tenant, uid("dan"), "phone") as dan,
        online(gw2, tenant, uid("erin"), "phone") as erin,
    ):
        await published(owner, keys)
        before = metric(keys_worker, fallback)
        results = await asyncio.gather(
            *(c.fetch_prekeys(carol) for _ in range(20) for c in (dan, erin))
        )
    handed = [b.one_time_prekey.key_id for r in results for b in r.bundles if b.one_time_prekey]
    exhausted = [b for r in results for b in r.bundles if b.one_time_exhausted]
    assert sorted(handed) == list(range(1, 31))  # every key once, none twice
    assert len(exhausted) == 10
    assert all(b.signed_prekey == keys.signed_prekey_frame() for b in exhausted)
    assert metric(keys_worker, fallback) - before == 10


async def test_the_owner_device_is_told_when_its_one_time_prekeys_run_low(
    gateways: tuple[Gateway, Gateway],
) -> None:
    gw1, gw2 = gateways
    tenant, fay = uid("t"), uid("fay")
    keys = DeviceKeys()
    keys.add_one_time(LOW_WATERMARK + 1)
    async with (
        online(gw1, tenant, fay, "phone") as owner,
        online(gw2, tenant, uid("gus"), "phone") as gus,
    ):
        await published(owner, keys)
        await gus.fetch_prekeys(fay)  # 4 -> 3: still at the watermark, no notice
        await gus.fetch_prekeys(fay)  # 3 -> 2: below it
        frame = await owner.next_event(timeout=WAIT_S)
        assert frame.header.request_id == 0
        assert isinstance(frame.body, PrekeyFetchDown)
        (status,) = frame.body.bundles
        assert (status.device_id, status.one_time_remaining) == ("phone", 2)
        # the refill re-uploads what the device still holds (1-4) plus new keys: the two
        # already handed out are never offered again
        keys.add_one_time(3)
        refilled = await published(owner, keys)
        assert refilled.bundles[0].one_time_remaining == 5
        nxt = await gus.fetch_prekeys(fay)
        assert nxt.bundles[0].one_time_prekey is not None
        assert nxt.bundles[0].one_time_prekey.key_id == 3


async def test_the_strict_tenant_gets_prekey_exhausted_then_recovers_after_the_refill(
    gateways: tuple[Gateway, Gateway], keys_worker: FaustWorker
) -> None:
    gw1, gw2 = gateways
    hal = uid("hal")
    keys = DeviceKeys()
    keys.add_one_time(1)
    async with (
        online(gw1, STRICT, hal, "phone") as owner,
        online(gw2, STRICT, uid("ivy"), "phone") as ivy,
    ):
        await published(owner, keys)
        first = await ivy.fetch_prekeys(hal)
        assert first.bundles[0].one_time_prekey is not None
        with pytest.raises(QimError) as refused:
            await ivy.fetch_prekeys(hal)
        assert refused.value.code is ErrorCode.PREKEY_EXHAUSTED
        assert refused.value.request_id != 0
        assert metric(keys_worker, "qim_prekey_exhausted_total") >= 1
        keys.take_one_time(1)  # the device learnt key 1 was used
        keys.add_one_time(2)
        await published(owner, keys)
        again = await ivy.fetch_prekeys(hal)
        assert again.bundles[0].one_time_prekey is not None
        assert again.bundles[0].one_time_prekey.key_id == 2


async def test_a_forged_signed_prekey_signature_is_refused_with_its_request_id(
    gateways: tuple[Gateway, Gateway],
) -> None:
    gw1, _ = gateways
    tenant, jon = uid("t"), uid("jon")
    keys = DeviceKeys()
    keys.add_one_time(2)
    frame = keys.publish_frame()
    spk = frame.signed_prekey
    assert spk is not None
    forger = Ed25519PrivateKey.generate()  # not the identity key the bundle names
    forged = SignedPreKey(
        key_id=spk.key_id, pub=spk.pub, signature=forger.sign(signed_prekey_message(1, spk.pub))
    )
    raw, _ = await gw1.online(jon, "phone", tenant)
    try:
        await raw.send(msgspec.structs.replace(frame, signed_prekey=forged), request_id=77)
        error = await raw.expect(Error, within=WAIT_S)
        assert raw.frames[-1].header.request_id == 77
        assert (error.code, error.request_id) == (int(ErrorCode.PERMISSION_DENIED), 77)
        assert error.detail == "signed_prekey_signature_invalid"
        # nothing was stored: a fetch of jon finds no bundle
        await raw.send(PrekeyFetch(target_user_id=jon), request_id=78)
        answer = await raw.expect(PrekeyFetchDown, within=WAIT_S)
        assert answer.bundles == ()
    finally:
        await raw.close()


async def test_bundles_survive_a_worker_restart_with_its_local_store_wiped(
    gateways: tuple[Gateway, Gateway], keys_worker: FaustWorker
) -> None:
    gw1, gw2 = gateways
    tenant, kim = uid("t"), uid("kim")
    keys = DeviceKeys()
    keys.add_one_time(3)
    async with online(gw1, tenant, kim, "phone") as owner:
        await published(owner, keys)
    async with online(gw2, tenant, uid("lee"), "phone") as lee:
        first = await lee.fetch_prekeys(kim)
    assert first.bundles[0].one_time_prekey is not None
    assert first.bundles[0].one_time_prekey.key_id == 1

    await asyncio.to_thread(keys_worker.stop)
    keys_worker.wipe_state()
    assert not await asyncio.to_thread(Path(keys_worker.datadir).exists)
    await asyncio.to_thread(keys_worker.start)

    async with online(gw2, tenant, uid("lee"), "phone") as lee:
        after = await lee.fetch_prekeys(kim)
    (bundle,) = after.bundles
    assert bundle.identity_pub == keys.identity_pub
    assert bundle.one_time_prekey is not None
    assert bundle.one_time_prekey.key_id == 2  # key 1 stays consumed across the rebuild
