"""@all limits (spec 11.4.2) and the tenant fanout quota (8.2 L3, 10.5.2) on the real stack.

One real conversation ``faust worker`` with per-tenant overrides (``QIM_TENANT_OVERRIDES``),
groups made through the admin HTTP plane, SDK clients through a routing gateway:

* a window of three @alls per conversation: the 4th is ``RATE_LIMITED`` with
  ``retry_after_ms`` and the request's id, nothing is committed, and an ordinary message in the
  same moment still goes through;
* a group above ``large_group_member_threshold``: a MEMBER's @all is ``RATE_LIMITED``
  (``at_all_min_role``), the OWNER's passes, and the same MEMBER passes once promoted to ADMIN;
* a tenant with a one-entry fanout quota: the first large-group send overdraws the bucket, the
  next is ``FANOUT_QUOTA_EXCEEDED`` with ``retry_after_ms``, a one-to-one send of the tenant is
  still accepted, and the worker's ``/metrics`` shows ``fanout_quota_rejected_total`` > 0.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from qim.admin import GroupAdminClient
from qim.client import Identity, QimClient, QimError
from qim.devstack.stack import Stack
from qim.schemas.frames import MENTION_ALL, ErrorCode
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS
from tests.integration.test_admin_groups import SECRET, WAIT_S, WRITER_ENV, serve, writer_serving
from tests.integration.test_gateway_routing import gateway, online
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
RATE_TENANT, ROLE_TENANT, QUOTA_TENANT = f"t-at3-{RUN}", f"t-atrole-{RUN}", f"t-fq-{RUN}"
OVERRIDES = {
    RATE_TENANT: {"at_all_rate_per_conversation": {"count": 3, "period_ms": 600_000}},
    ROLE_TENANT: {
        "large_group_member_threshold": 3,  # the 4-member group is "large"
        "at_all_rate_per_conversation": {"count": 10, "period_ms": 600_000},
    },
    QUOTA_TENANT: {
        "large_group_member_threshold": 2,
        "tenant_fanout_quota": {"count": 1, "period_ms": 3_600_000},
    },
}
ALL = (MENTION_ALL,)


async def _refused(client: QimClient, group: str, cmid: str, *, at_all: bool = True) -> QimError:
    with pytest.raises(QimError) as info:
        await client.send_message(
            group, b"everyone!", client_message_id=cmid, mention_targets=ALL if at_all else ()
        )
    return info.value


def _metric(port: int, family: str, labels: dict[str, str]) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == family and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def test_at_all_window_min_role_and_the_tenant_fanout_quota(
    stack: Stack, tmp_path: Path
) -> None:
    env = {**WRITER_ENV, "QIM_TENANT_OVERRIDES": json.dumps(OVERRIDES)}
    worker = FaustWorker(stack, "qim.apps.conversation", tmp_path / "writer", env)
    await asyncio.to_thread(worker.start)
    try:
        await writer_serving(worker)
        admin = await serve(stack, timeout_s=WAIT_S)
        try:
            operator = GroupAdminClient(admin.url, SECRET, actor="ops", timeout_s=WAIT_S + 10)

            def owner(user: str) -> GroupAdminClient:
                return GroupAdminClient(
                    admin.url, SECRET, actor=user, as_member=True, timeout_s=WAIT_S + 10
                )

            window, large, quota = f"g:at3-{RUN}", f"g:atrole-{RUN}", f"g:fq-{RUN}"
            await asyncio.to_thread(operator.create, RATE_TENANT, window, "alice", ["bob", "carol"])
            made = await asyncio.to_thread(
                operator.create, ROLE_TENANT, large, "alice", ["bob", "carol", "dave"]
            )
            assert made["member_count"] == 4
            await asyncio.to_thread(operator.create, QUOTA_TENANT, quota, "alice", ["bob", "carol"])

            async with gateway(stack, "gw-at-all") as gw:
                # -- the 4th @all in a window of three (at_all_rate_per_conversation) --------
                async with (
                    online(gw, "alice", tenant=RATE_TENANT) as alice,
                    online(gw, "bob", tenant=RATE_TENANT) as bob,
                    online(gw, "carol", tenant=RATE_TENANT) as carol,
                ):
                    acks = []
                    for i, who in enumerate((alice, bob, carol)):
                        ack = await who.send_message(
                            window, b"@all", client_message_id=f"w-{i}", mention_targets=ALL
                        )
                        acks.append(ack)
                    fourth = await _refused(alice, window, "w-3")
                    assert fourth.code is ErrorCode.RATE_LIMITED
                    assert fourth.detail == "at_all_rate_per_conversation"
                    assert fourth.retry_after_ms is not None
                    assert 0 < fourth.retry_after_ms <= 600_000
                    assert fourth.request_id != 0
                    # an ordinary message right after is not throttled by the @all window
                    plain = await bob.send_message(window, b"lunch?", client_message_id="w-p")
                    history = await carol.pull_history(window, limit=20)
                    sent = {m.client_message_id: m for m in history.messages}
                    assert {"w-0", "w-1", "w-2", "w-p"} <= set(sent)
                    assert "w-3" not in sent  # refused, never downgraded to a plain message
                    assert sent["w-2"].mention_targets == ALL
                    assert plain.conversation_seq == acks[-1].conversation_seq + 1

                # -- at_all_min_role in a group above large_group_member_threshold -----------
                async with (
                    online(gw, "alice", tenant=ROLE_TENANT) as alice,
                    online(gw, "bob", tenant=ROLE_TENANT) as bob,
                ):
                    denied = await _refused(bob, large, "r-bob-1")
                    assert denied.code is ErrorCode.RATE_LIMITED
                    assert denied.detail == "at_all_min_role"
                    assert denied.retry_after_ms == RETRY_AFTER_NEVER_MS
                    await alice.send_message(
                        large, b"@all", client_message_id="r-alice", mention_targets=ALL
                    )
                    await asyncio.to_thread(
                        owner("alice").set_role, ROLE_TENANT, large, "bob", "ADMIN"
                    )
                    promoted = await bob.send_message(
                        large, b"@all", client_message_id="r-bob-2", mention_targets=ALL
                    )
                    assert promoted.conversation_seq >= 1

                # -- tenant_fanout_quota: FANOUT_QUOTA_EXCEEDED and the metric ---------------
                async with (
                    online(gw, "alice", tenant=QUOTA_TENANT) as alice,
                    online(gw, "bob", tenant=QUOTA_TENANT) as bob,
                ):
                    family = "fanout_quota_rejected_total"
                    labels = {"tenant": QUOTA_TENANT}
                    assert _metric(worker.web_port, family, labels) is None
                    await alice.send_message(quota, b"first", client_message_id="q-1")
                    over = await _refused(bob, quota, "q-2", at_all=False)
                    assert over.code is ErrorCode.FANOUT_QUOTA_EXCEEDED
                    assert over.retry_after_ms is not None and over.retry_after_ms > 0
                    # a one-to-one send of the same tenant is not refused (10.5.2: large groups)
                    bob.identity = Identity(QUOTA_TENANT, "bob")
                    direct = await bob.send_direct("alice", b"psst", client_message_id="q-d")
                    assert direct.conversation_seq >= 1
                    assert _metric(worker.web_port, family, labels) == 1.0
                    history = await alice.pull_history(quota, limit=10)
                    assert [m.client_message_id for m in history.messages].count("q-2") == 0
        finally:
            await admin.close()
    finally:
        await asyncio.to_thread(worker.stop)
