"""Event-group caps (spec 6.7, seed 003 M-14): split only when exceeded, never exceed after."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.fanout import (
    EventGroupOverflow,
    FanoutConfig,
    FanoutState,
    check_event_group_caps,
    chunk_dispatch_id,
    expand_dispatch,
    message_dispatch,
    planned_entries,
    split_event_groups,
)
from qim.core.membership import SliceAssembler
from qim.params import Settings
from qim.schemas import dispatch_id
from qim.schemas.events import EventType
from qim.schemas.ids import message_id_from_bytes
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from tests.unit.fanout.support import Outbox, after_create, pipeline

G = "g:caps"


def _dispatch(
    config: FanoutConfig, *, payload: bytes, inline: bool, mentions: tuple[str, ...] = ("a",)
) -> tuple[GroupDispatch, list[GroupDispatch], list[object]]:
    """(the unsplit dispatch, what FanoutState produced for the message, the whole output)."""
    outbox = Outbox(shards=1)
    outbox.create(G, "owner", ["a", "b"])
    record = outbox.send(G, "owner", mentions=mentions, payload=payload, inline=inline)
    produced = pipeline(outbox, FanoutState(config))
    chunks = after_create(produced)
    return message_dispatch(record, 0), chunks, list(produced)


def _size(d: GroupDispatch, config: FanoutConfig) -> int:
    return sum(e.size for e in planned_entries(d, config))


def test_6_7_default_policy_is_one_entry_per_recipient_and_never_splits() -> None:
    config = FanoutConfig(mailbox_shard_count=1)
    unsplit, chunks, _ = _dispatch(config, payload=b"x" * 2048, inline=True)
    assert [e.event_type for e in planned_entries(unsplit, config)] == [EventType.MESSAGE]
    assert chunks == [unsplit]
    assert _size(unsplit, config) <= config.event_group_max_bytes


@settings(max_examples=150, deadline=None)
@given(
    payload=st.integers(0, 9000),
    inline=st.booleans(),
    mentions=st.sampled_from([(), ("a",), ("@all",)]),
    max_bytes=st.sampled_from([1024, 4096, 8192]),
    max_items=st.sampled_from([1, 2, 8]),
)
def test_6_7_split_happens_iff_the_worst_case_group_exceeds_a_cap(
    payload: int, inline: bool, mentions: tuple[str, ...], max_bytes: int, max_items: int
) -> None:
    config = FanoutConfig(
        mailbox_shard_count=1,
        mention_entries=True,
        event_group_max_bytes=max_bytes,
        event_group_max_items=max_items,
    )
    unsplit, chunks, produced = _dispatch(
        config, payload=b"p" * payload, inline=inline, mentions=mentions
    )
    entries = planned_entries(unsplit, config)
    over = len(entries) > max_items or _size(unsplit, config) > max_bytes
    assert (len(chunks) > 1 or chunks[0] != unsplit) == over
    assert check_event_group_caps(chunks, config) == []
    assert chunks[0].dispatch_id == dispatch_id(message_id_from_bytes(unsplit.message_id), 0)
    assert all(c.payload == unsplit.payload for c in chunks)  # the body rides along in each
    # a split changes which mailbox_seq an entry lands on, never who gets what
    assembler = SliceAssembler()
    slices = [assembler.apply(r) for r in produced if isinstance(r, MemberSliceRecord)]
    (shard_slice,) = [s for s in slices if s is not None]
    whole = expand_dispatch(unsplit, shard_slice, lambda u: 0, mention_entries=True)
    parts = [
        e
        for c in chunks
        for e in expand_dispatch(c, shard_slice, lambda u: 0, mention_entries=True)
    ]
    assert sorted(parts) == list(whole)


def test_6_7_two_entries_over_the_item_cap_become_two_chunks_with_their_own_ids() -> None:
    config = FanoutConfig(mailbox_shard_count=1, mention_entries=True, event_group_max_items=1)
    unsplit, chunks, _ = _dispatch(config, payload=b"hi", inline=False)
    mid = message_id_from_bytes(unsplit.message_id)
    assert [(c.chunk_index, c.chunk_count, c.event_type) for c in chunks] == [
        (0, 2, EventType.MESSAGE),
        (1, 2, EventType.MENTION),
    ]
    assert [c.dispatch_id for c in chunks] == [chunk_dispatch_id(mid, 0, i) for i in (0, 1)]
    assert chunks[0].event_template.mention_targets == ("a",)  # mention_type stays on MESSAGE


def test_6_7_an_inline_body_too_big_for_one_group_ships_without_inline_in_every_chunk() -> None:
    config = FanoutConfig(mailbox_shard_count=1, event_group_max_bytes=1024)
    unsplit, chunks, _ = _dispatch(config, payload=b"z" * 1500, inline=True)
    assert _size(unsplit, config) > 1024
    (only,) = chunks
    assert (only.inline_body, only.payload, only.chunk_count) == (False, unsplit.payload, 1)
    assert check_event_group_caps(chunks, config) == []


def test_6_7_an_entry_that_cannot_fit_even_without_a_body_is_an_error_of_ours() -> None:
    config = FanoutConfig(mailbox_shard_count=1, event_group_max_bytes=64)
    outbox = Outbox(shards=1)
    outbox.create(G, "owner", ["a"])
    record = outbox.send(G, "owner")
    with pytest.raises(EventGroupOverflow):
        split_event_groups(message_dispatch(record, 0), config)


def test_6_7_checker_reports_each_injected_violation() -> None:
    config = FanoutConfig(mailbox_shard_count=1, mention_entries=True, event_group_max_items=1)
    _, (first, second), _ = _dispatch(config, payload=b"hi", inline=False)
    assert check_event_group_caps([first, second, first], config) == []  # duplicates are legal
    wrong_id = msgspec.structs.replace(second, dispatch_id=first.dispatch_id)
    same_type = msgspec.structs.replace(second, event_type=int(EventType.MESSAGE))
    whole = msgspec.structs.replace(first, chunk_count=1)  # two entries in one group again
    cases = {
        "dispatch_id": [first, wrong_id],
        "chunks [0] of": [first],
        "two chunks of one event_type": [first, same_type],
        "event group of 2 entries": [whole],
    }
    for needle, dispatches in cases.items():
        problems = check_event_group_caps(dispatches, config)
        assert any(needle in p for p in problems), (needle, problems)


def test_b2_caps_and_b5_1_broadcast_threshold_come_from_settings() -> None:
    config = FanoutConfig.from_settings(Settings.load(env={}))
    assert (config.mailbox_shard_count, config.virtual_bucket_count) == (64, 65536)
    assert (config.event_group_max_items, config.event_group_max_bytes) == (8, 8192)
    assert config.membership_event_broadcast_max_members == 500
    assert not config.mention_entries  # mailbox_write_policy = always (10.2.3)
    with pytest.raises(ValueError):
        FanoutConfig(mailbox_shard_count=48)
