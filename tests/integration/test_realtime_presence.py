"""PRESENCE_SUB across two gateways (issue 16, spec 13.2, AT-52, AT-53).

The watcher is owned by one gateway, the users it watches by the other; each gateway folds the
whole compacted presence topic (written only by the owners of the watched users' shards) and
answers from it. Checked on the real stack: a subscribe is answered with a full snapshot, a
login and a logout of a watched user arrive as increments (request_id 0); 201 targets, or a
subscribe that would take the set past 200, are refused RATE_LIMITED with the "do not retry"
hint and subscribe nothing; a group's members can be watched by conversation_id, a mixed
request and a stranger's conversation are refused; a new connection starts with no
subscription.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from qim.client import QimClient, QimError, retry_delay_ms
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode, Frame
from qim.schemas.frames.control import PresenceSubDown
from qim.schemas.frames.errors import RETRY_AFTER_NEVER_MS
from tests.integration.realtime_support import collect_until, nodes, pipeline, user_on

pytestmark = pytest.mark.integration


def shows(user: str, state: str) -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        body = frame.body
        return (
            isinstance(body, PresenceSubDown)
            and frame.header.request_id == 0
            and any(e.user_id == user and e.state == state for e in body.entries)
        )

    return match


def users_in(bodies: Sequence[object]) -> set[str]:
    return {e.user_id for b in bodies if isinstance(b, PresenceSubDown) for e in b.entries}


async def test_presence_snapshot_then_increments_across_gateways_and_its_limits(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-pres-{uuid.uuid4().hex[:6]}"
    group = f"g:pres-{uuid.uuid4().hex[:6]}"
    async with pipeline(stack, tmp_path), nodes(stack) as (a, b):
        watcher_id = user_on(a, tenant, "watcher-")
        # one presence partition for the three: their records reach the watcher's gateway in
        # the order they were written, so one of them is a barrier for another
        x = user_on(b, tenant, "x-")
        member = user_on(b, tenant, "member-", near=x)
        late = user_on(b, tenant, "late-", near=x)
        clients: list[QimClient] = []
        try:
            watcher = await a.online(tenant, watcher_id, "phone")
            clients.append(watcher)

            # AT-52: a full snapshot first ...
            snap = await watcher.subscribe_presence((x, "nobody"))
            assert {(e.user_id, e.state) for e in snap.entries} == {
                (x, "offline"),
                ("nobody", "offline"),
            }
            # ... then increments: x logs in on the other gateway, then out again.
            x_phone = await b.online(tenant, x, "phone")
            clients.append(x_phone)
            await collect_until(watcher, shows(x, "online"), "x online")
            assert watcher.presence[x].state == "online"
            await x_phone.close()
            await collect_until(watcher, shows(x, "offline"), "x offline")

            # 201 targets in one frame: RATE_LIMITED, "do not retry", nothing subscribed.
            many = tuple(f"u{i}" for i in range(201))
            with pytest.raises(QimError) as refused:
                await watcher.subscribe_presence(many)
            assert refused.value.code == int(ErrorCode.RATE_LIMITED)
            assert refused.value.retry_after_ms == RETRY_AFTER_NEVER_MS
            assert retry_delay_ms(refused.value) is None
            # 2 + 198 = 200 fits; one more (``late``) would make 201 and is refused whole.
            await watcher.subscribe_presence(tuple(f"v{i}" for i in range(198)))
            with pytest.raises(QimError) as past:
                await watcher.subscribe_presence((late, "v-extra"))
            assert past.value.code == int(ErrorCode.RATE_LIMITED)
            assert past.value.retry_after_ms == RETRY_AFTER_NEVER_MS
            assert retry_delay_ms(past.value) is None
            late_pc = await b.online(tenant, late, "pc")  # not watched: no increment for it
            clients.append(late_pc)
            x_again = await b.online(tenant, x, "laptop")  # the barrier behind it
            clients.append(x_again)
            seen = await collect_until(watcher, shows(x, "online"), "x online again")
            assert late not in users_in(seen), "a refused subscription was partly applied"

            # by conversation: the group's members (not the watcher itself)
            member_pc = await b.online(tenant, member, "pc")
            clients.append(member_pc)
            await watcher.create_group(group, (member, x))
            by_group = await watcher.subscribe_presence(conversation_id=group, action="replace")
            assert {(e.user_id, e.state) for e in by_group.entries} == {
                (member, "online"),
                (x, "online"),
            }
            # AT-53: a frame that mixes both is refused; so is a conversation one is not in
            with pytest.raises(QimError) as mixed:
                await watcher.subscribe_presence((x,), conversation_id=group)
            assert mixed.value.code == int(ErrorCode.PERMISSION_DENIED)
            with pytest.raises(QimError) as stranger:
                await late_pc.subscribe_presence(conversation_id=group)
            assert stranger.value.code == int(ErrorCode.PERMISSION_DENIED)

            # soft state: a new connection of the watcher has no subscription until it asks
            fresh = await a.online(tenant, watcher_id, "tablet")
            clients.append(fresh)
            await fresh.subscribe_presence((late,))
            await member_pc.close()  # watched by the phone only
            await collect_until(watcher, shows(member, "offline"), "member offline")
            await late_pc.close()
            seen = await collect_until(fresh, shows(late, "offline"), "late offline")
            assert member not in users_in(seen), "a new connection inherited a subscription"
        finally:
            for client in clients:
                await client.close()
