"""Live == replay, byte for byte, for any sequence of membership operations (direction 4.7).

Random create/add/remove/ban/leave/send programs run against the live harness (operations +
apply, refusals included); the outbox log is then replayed into an empty state. The encoded
states, the version snapshots and the member slices must be identical, and the invariants of
spec 7.9 (slot ids never reused) and 7.5 (interval bounds) must hold at every step.
"""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from qim.core.membership import (
    GroupMembership,
    MembershipRejected,
    create_group,
    member_slices,
    version_snapshot,
)
from qim.schemas.records.membership import encode_membership_record
from tests.unit.membership.support import Harness

TENANTS = ("t1", "t2")
GROUPS = ("g:a", "g:b")
USERS = tuple(f"u{i}" for i in range(10))
POOL = USERS + tuple(f"x{i}" for i in range(30))

_op = st.tuples(
    st.sampled_from(("create", "add", "remove", "ban", "leave", "send")),
    st.sampled_from(TENANTS),
    st.sampled_from(GROUPS),
    st.lists(st.sampled_from(USERS), max_size=4),
)


def _run(h: Harness, program: list[tuple[str, str, str, list[str]]]) -> None:
    for kind, tenant, group, users in program:
        try:
            if kind == "create":
                h.create(tenant, group, users[0] if users else "u0", users[1:])
            elif kind == "add":
                h.add(tenant, group, users, hints={u: f"Nick{u}" for u in users[::2]})
            elif kind in ("remove", "ban"):
                h.remove(tenant, group, users, ban=kind == "ban")
            elif kind == "leave":
                h.leave(tenant, group, users[0] if users else "u0")
            else:
                h.send(tenant, group, len(users) + 1)
        except MembershipRejected:
            pass
        _check_invariants(h.state)


def _check_invariants(state: GroupMembership) -> None:
    for tenant in TENANTS:
        for group_id in GROUPS:
            group = state.group(tenant, group_id)
            if group is None:
                continue
            slots = [row.slot_id for row in group.rows.values()]
            assert len(set(slots)) == len(slots)  # 7.9: a slot id belongs to one user only
            assert all(s < group.next_slot for s in slots)
            assert group.member_count == sum(row.active for row in group.rows.values())
            for row in group.rows.values():
                assert (row.left_at is None) == row.active
                assert row.left_at is None or row.left_at > row.joined_at
            for prefix in ("u1", "ni", "NICKU"):  # the search indexes follow every change
                folded = prefix.casefold()
                expected = {
                    row.slot_id
                    for row in group.rows.values()
                    if row.active
                    and (
                        row.user_id.startswith(prefix)
                        or row.display_hint.casefold().startswith(folded)
                    )
                }
                assert set(group.search(prefix)) == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=40))
@example(
    [
        ("create", "t1", "g:a", ["u0", "u1", "u2", "u3", "u4"]),
        ("send", "t1", "g:a", ["u1"]),
        ("leave", "t1", "g:a", ["u1"]),
        ("add", "t1", "g:a", ["u1", "u5", "u6", "u7"]),
        ("ban", "t1", "g:a", ["u2", "u5"]),
        ("add", "t1", "g:a", ["u2"]),
        ("create", "t2", "g:a", ["u9", "u1"]),
        ("remove", "t2", "g:a", ["u1"]),
    ]
)
def test_7_9_replay_of_the_outbox_equals_the_live_state_byte_for_byte(
    program: list[tuple[str, str, str, list[str]]],
) -> None:
    live = Harness(chunk_max_members=3)
    _run(live, program)
    replayed = live.replay()
    assert replayed.encode() == live.state.encode()
    _check_invariants(GroupMembership.decode(live.state.encode(), mailbox_shard_count=64))
    assert GroupMembership.decode(live.state.encode(), mailbox_shard_count=64).encode() == (
        live.state.encode()
    )
    for published in live.published[-4:]:
        group_live = live.state.group(published.tenant_id, published.group_id)
        group_replay = replayed.group(published.tenant_id, published.group_id)
        assert group_live is not None and group_replay is not None
        if group_live.version != published.membership_version:
            continue
        assert version_snapshot(group_live) == version_snapshot(group_replay)
        assert member_slices(group_live, published) == member_slices(group_replay, published)


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.sampled_from(USERS + tuple(f"x{i}" for i in range(30))), max_size=40), st.randoms()
)
def test_7_9_shuffling_the_member_list_gives_identical_version_bytes(
    invitees: set[str], rnd: random.Random
) -> None:
    ordered = sorted(invitees)
    shuffled = list(ordered)
    rnd.shuffle(shuffled)
    shuffled += shuffled[:3]  # duplicates in the request change nothing either
    outputs = []
    for members in (ordered, shuffled):
        state = GroupMembership(mailbox_shard_count=64)
        records = create_group(
            state,
            tenant_id="t1",
            group_id="g:x",
            creator="owner",
            invitees=members,
            committed_at=5,
            max_members=1000,
            chunk_max_members=7,
        )
        published = [p for p in map(state.apply, records) if p is not None]
        group = state.group("t1", "g:x")
        assert group is not None and len(published) == 1
        outputs.append(
            (
                [encode_membership_record(r) for r in records],
                encode_membership_record(version_snapshot(group)),
                [encode_membership_record(s) for s in member_slices(group, published[0])],
                state.encode(),
            )
        )
    assert outputs[0] == outputs[1]
