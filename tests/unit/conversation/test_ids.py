"""Conversation ids: the deterministic one-to-one id and the group form (spec 7 Part 2, ours)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.core.conversation import (
    MAX_CONVERSATION_ID_BYTES,
    conversation_kind,
    direct_conversation_id,
    direct_participants,
    group_conversation_id,
    group_id_for,
    is_direct_participant,
    validate_conversation_id,
)
from qim.schemas import blake3_digest, hash_input

ids = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=20,
)


def test_direct_id_is_the_documented_derivation() -> None:
    digest = blake3_digest(hash_input("qim.direct-conversation.v1", "acme", "alice", "bob"))
    assert direct_conversation_id("acme", "bob", "alice") == "d:" + digest[:16].hex()
    assert len(direct_conversation_id("acme", "alice", "bob")) == 34


@given(ids, ids, ids)
def test_direct_id_is_order_independent_and_well_formed(tenant: str, a: str, b: str) -> None:
    conv = direct_conversation_id(tenant, a, b)
    assert conv == direct_conversation_id(tenant, b, a)
    assert conversation_kind(conv) == "direct"
    assert is_direct_participant(tenant, conv, a, b)
    assert is_direct_participant(tenant, conv, b, a)


def test_direct_id_is_tenant_scoped() -> None:
    assert direct_conversation_id("t1", "alice", "bob") != direct_conversation_id(
        "t2", "alice", "bob"
    )
    conv = direct_conversation_id("t1", "alice", "bob")
    assert not is_direct_participant("t2", conv, "alice", "bob")
    assert not is_direct_participant("t1", conv, "alice", "carol")
    assert not is_direct_participant("t1", conv, "alice", "")


def test_direct_participants_are_sorted_by_utf8_and_a_note_to_self_has_one() -> None:
    assert direct_participants("zed", "émile") == ("zed", "émile")
    assert direct_participants("bob", "alice") == ("alice", "bob")
    assert direct_participants("alice", "alice") == ("alice",)


def test_group_conversation_id_is_the_group_id() -> None:
    assert group_id_for("team") == "g:team"
    assert group_conversation_id("g:team") == "g:team"
    assert conversation_kind("g:team") == "group"
    with pytest.raises(ValueError):
        group_conversation_id("team")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "g:",
        "x:abc",
        "d:" + "0" * 31,
        "d:" + "A" * 32,
        "d:" + "0" * 33,
        "g:a\x00b",
        "g:" + "x" * MAX_CONVERSATION_ID_BYTES,
    ],
)
def test_malformed_conversation_ids_are_rejected(bad: str) -> None:
    assert conversation_kind(bad) is None
    with pytest.raises(ValueError):
        validate_conversation_id(bad)
