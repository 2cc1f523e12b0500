"""PULL_MEMBERS paging (A.3 #20, A.4 #20, B.6.1, acceptance 26.3.9)."""

from __future__ import annotations

import msgspec
import pytest

from qim.core.membership import (
    MemberPageLimits,
    MembershipRejected,
    create_reply,
    leave_reply,
    pull_members,
)
from qim.params import Settings
from qim.schemas.frames.members import MemberListBatch, PullMembers
from qim.schemas.records.membership import Role
from tests.unit.membership.support import Harness

T = "t1"
G = "g:club"
LIMITS = MemberPageLimits(default_limit=4, hard_limit=6, search_min_prefix=2)


def _group(n: int = 10) -> Harness:
    h = Harness()
    h.create(T, G, "owner", [f"m{i:02d}" for i in range(n)])
    return h


def _pull(h: Harness, requester: str = "owner", **fields: object) -> MemberListBatch:
    request = msgspec.structs.replace(PullMembers(conversation_id=G), **fields)
    return pull_members(h.state, tenant_id=T, requester=requester, request=request, limits=LIMITS)


def _walk(h: Harness, limit: int, filter: str = "all") -> list[str]:
    seen: list[str] = []
    offset = 0
    while True:
        page = _pull(h, offset=offset, limit=limit, filter=filter)
        seen += [m.user_id for m in page.members]
        assert page.next_offset == offset + len(page.members)
        if not page.has_more:
            return seen
        offset = page.next_offset


def test_A3_20_all_filter_pages_in_slot_order_without_duplicates_or_gaps() -> None:
    h = _group()
    walked = _walk(h, limit=3)
    assert walked == ["owner"] + [f"m{i:02d}" for i in range(10)]  # slot (join) order
    last = _pull(h, offset=9, limit=3)
    assert [m.user_id for m in last.members] == ["m08", "m09"]
    assert (last.total_hint, last.next_offset, last.has_more) == (11, 11, False)
    exact = _pull(h, offset=8, limit=3)
    assert exact.next_offset == 11 and not exact.has_more  # page ends exactly at the end
    past = _pull(h, offset=50, limit=3)
    assert past.members == () and not past.has_more and past.total_hint == 11


def test_26_3_9_walk_during_joins_has_no_duplicates_or_omissions() -> None:
    h = _group()
    seen: list[str] = []
    offset = 0
    joined = iter(f"late{i}" for i in range(5))
    while True:
        page = _pull(h, offset=offset, limit=2)
        seen += [m.user_id for m in page.members]
        h.add(T, G, [next(joined, "late0")])  # a join between every two pages
        if not page.has_more:
            break
        offset = page.next_offset
    assert len(seen) == len(set(seen))
    assert set(seen) >= {"owner", *(f"m{i:02d}" for i in range(10))}


def test_B61_limit_zero_takes_the_default_and_large_limits_are_clamped() -> None:
    h = _group(20)
    assert len(_pull(h).members) == 4  # member_page_limit
    assert len(_pull(h, limit=1000).members) == 6  # member_page_hard_limit
    assert len(_pull(h, limit=5).members) == 5
    limits = MemberPageLimits.from_settings(Settings.load())
    assert (limits.default_limit, limits.hard_limit, limits.search_min_prefix) == (100, 200, 2)
    assert limits.clamp(0) == 100 and limits.clamp(500) == 200


def test_A3_20_admin_and_banned_filters() -> None:
    h = _group(5)
    h.add(T, G, ["boss"], role=Role.ADMIN)
    h.remove(T, G, ["m03", "m01"], ban=True)
    h.remove(T, G, ["m02"])  # removed, not banned
    admins = _pull(h, filter="admin")
    assert [(m.user_id, m.role) for m in admins.members] == [("owner", "OWNER"), ("boss", "ADMIN")]
    banned = _pull(h, filter="banned")
    assert [m.user_id for m in banned.members] == ["m01", "m03"]
    assert banned.total_hint == 2
    assert "m02" not in _walk(h, limit=10, filter="all")


def test_A3_20_search_is_a_server_prefix_match_on_id_or_display_hint() -> None:
    h = _group(3)
    h.add(T, G, ["zoe", "zack", "u777"])
    h.add(T, G, ["u1", "u2", "zed"], hints={"u1": "Zelda", "u2": "Bob", "zed": "Zed"})
    assert [m.user_id for m in _pull(h, filter="search", query="za").members] == ["zack"]
    assert [m.user_id for m in _pull(h, filter="search", query="u7").members] == ["u777"]
    found = _pull(h, filter="search", query="ze")  # "Zelda" (hint) and "zed" (id and hint)
    assert [(m.user_id, m.display_hint) for m in found.members] == [("u1", "Zelda"), ("zed", "Zed")]
    assert found.total_hint == 2  # a member matching on id and hint is listed once
    h.leave(T, G, "zed")
    assert [m.user_id for m in _pull(h, filter="search", query="ZE").members] == ["u1"]


def test_26_3_9_short_search_query_and_unknown_filter_return_empty_pages() -> None:
    h = _group()
    short = _pull(h, filter="search", query="m")
    assert short.members == () and short.total_hint == 0 and not short.has_more
    assert _pull(h, filter="everyone").members == ()


def test_A4_20_members_carry_joined_at_conversation_seq() -> None:
    h = _group(2)
    h.send(T, G, 500)
    h.add(T, G, ["newbie"])
    members = {m.user_id: m.joined_at_conversation_seq for m in _pull(h, limit=6).members}
    assert members == {"owner": 0, "m00": 0, "m01": 0, "newbie": 500}


def test_A3_20_only_active_members_may_list_and_tenants_do_not_leak() -> None:
    h = _group()
    h.leave(T, G, "m00")
    for requester in ("m00", "stranger"):
        with pytest.raises(MembershipRejected):
            _pull(h, requester=requester)
    with pytest.raises(MembershipRejected):
        request = PullMembers(conversation_id=G)
        pull_members(h.state, tenant_id="t2", requester="owner", request=request)


def test_A3_21_22_create_and_leave_replies_reuse_member_list_batch() -> None:
    h = _group(3)
    reply = create_reply(h.state, tenant_id=T, group_id=G, creator="owner")
    assert [m.user_id for m in reply.members] == ["owner", "m00", "m01", "m02"]
    h.leave(T, G, "m01")
    assert leave_reply(h.state.member_count(T, G)) == MemberListBatch(total_hint=3)
