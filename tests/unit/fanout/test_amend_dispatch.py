"""Fanout of RECALL / EDIT (spec 13.4.1 step 5, AT-57): CONTROL dispatches to a message's users."""

from __future__ import annotations

import msgspec

from qim.core.fanout import AMEND_TEMPLATE, FanoutConfig, FanoutState
from qim.schemas import dispatch_id
from qim.schemas.events import EventType
from qim.schemas.ids import message_id_from_bytes
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.outbox import AmendAction, MessageAmended, MessageCommitted
from tests.unit.fanout.support import Outbox, run, shard_of

SHARDS = 8
USERS = [f"user-{i:02d}" for i in range(20)]


def _amend(message: MessageCommitted, outbox: Outbox, action: AmendAction) -> MessageAmended:
    """What the writer appends for ``action`` on ``message`` (coordinates from ``outbox``)."""
    if message.conversation_kind == "direct":  # takes the next seq and ids
        twin = outbox.direct(message.participants[0], message.participants[1])
    else:
        twin = outbox.send(message.conversation_id, "user-03")
    outbox.log.pop()
    return MessageAmended(
        tenant_id=twin.tenant_id,
        conversation_id=twin.conversation_id,
        conversation_kind=twin.conversation_kind,
        participants=twin.participants,
        message_id=twin.message_id,
        conversation_seq=twin.conversation_seq,
        last_activity_id=twin.last_activity_id,
        sender_id="user-03",
        origin_device_id="dev-9",
        action=action,
        target_message_id=message.message_id,
        target_conversation_seq=message.conversation_seq,
        target_sender_id=message.sender_id,
        target_flags=7,
        target_mention_targets=("user-05",),
        new_payload=b"v2" if action == "edit" else b"",
        repairs_preview=True,
        preview_or_placeholder=b"preview",
        membership_version=twin.membership_version,
        member_count=twin.member_count,
        committed_at=twin.committed_at,
        fencing_epoch=twin.fencing_epoch,
    )


def _dispatches(produced: object) -> list[GroupDispatch]:
    assert isinstance(produced, list)
    return [d for d in produced if isinstance(d, GroupDispatch)]


def test_at_57_amend_is_a_control_dispatch_per_shard_of_a_message_at_its_seq() -> None:
    outbox = Outbox(shards=SHARDS)
    outbox.create("g:x", "user-00", USERS[1:12])
    target = outbox.send("g:x", "user-01", mentions=("user-05",))
    outbox.add("g:x", USERS[12:])
    outbox.remove("g:x", ["user-07"])
    for action in ("recall", "edit"):
        amend = _amend(target, outbox, action)
        state = FanoutState(FanoutConfig(mailbox_shard_count=SHARDS))
        run(state, outbox.log)
        produced = _dispatches(state.apply_outbox(amend))
        # the same record as a message: recipients are those of a message at this seq
        twin = msgspec.structs.replace(
            target,
            message_id=amend.message_id,
            conversation_seq=amend.conversation_seq,
            last_activity_id=amend.last_activity_id,
            membership_version=amend.membership_version,
            member_count=amend.member_count,
        )
        expected = _dispatches(state.apply_outbox(twin))
        assert [d.target_mailbox_shard for d in produced] == [
            d.target_mailbox_shard for d in expected
        ]
        assert len(produced) >= 2
        for d, m in zip(produced, expected, strict=True):
            assert d.partition == d.target_mailbox_shard
            assert (
                d.dispatch_id
                == m.dispatch_id
                == dispatch_id(message_id_from_bytes(amend.message_id), d.target_mailbox_shard)
            )
            assert (d.membership_version, d.conversation_seq) == (
                m.membership_version,
                m.conversation_seq,
            )
            assert d.event_type == int(EventType.CONTROL)
            assert d.event_template == AMEND_TEMPLATE
            assert not d.event_template.counts_unread
            assert not d.event_template.affects_session_order
            assert d.event_template.timeline_visible
            assert d.inline_body is False
            assert d.payload == (b"v2" if action == "edit" else b"")
            assert d.amend_action == action
            assert (d.target_message_id, d.target_conversation_seq) == (
                target.message_id,
                target.conversation_seq,
            )
            assert (d.target_sender_id, d.target_flags) == ("user-01", 7)
            assert d.target_mention_targets == ("user-05",)
            assert d.preview_or_placeholder == b"preview"
            assert (d.sender_id, d.origin_device_id) == ("user-03", "dev-9")
            assert m.amend_action is None and m.preview_or_placeholder == b""


def test_direct_amend_goes_to_the_participants_shards() -> None:
    outbox = Outbox(shards=SHARDS)
    target = outbox.direct("user-01", "user-02")
    amend = _amend(target, outbox, "recall")
    state = FanoutState(FanoutConfig(mailbox_shard_count=SHARDS))
    run(state, outbox.log)
    produced = _dispatches(state.apply_outbox(amend))
    message = _dispatches(run(FanoutState(FanoutConfig(mailbox_shard_count=SHARDS)), [target]))
    assert [d.target_mailbox_shard for d in produced] == [d.target_mailbox_shard for d in message]
    assert all(d.participants == ("user-01", "user-02") for d in produced)
    assert all(d.event_type == int(EventType.CONTROL) for d in produced)


def test_a_recall_also_rewrites_the_copies_on_a_shard_left_only_with_former_members() -> None:
    """13.4 / issue 14: a removed member's entry keeps the target's body copy on its shard, so
    the recall reaches that shard too -- with no recipient (version 0), no entry, no slice."""
    owner = "user-00"
    shard_of_owner = shard_of(owner, SHARDS)
    former = next(u for u in USERS if shard_of(u, SHARDS) != shard_of_owner)
    outbox = Outbox(shards=SHARDS)
    outbox.create("g:left", owner, [former])
    target = outbox.send("g:left", owner)
    outbox.remove("g:left", [former])
    amend = _amend(target, outbox, "recall")
    state = FanoutState(FanoutConfig(mailbox_shard_count=SHARDS))
    run(state, outbox.log)
    produced = _dispatches(state.apply_outbox(amend))
    by_shard = {d.target_mailbox_shard: d for d in produced}
    assert set(by_shard) == {shard_of_owner, shard_of(former, SHARDS)}
    extra = by_shard[shard_of(former, SHARDS)]
    assert (extra.membership_version, extra.participants) == (0, ())
    assert extra.amend_action == "recall" and extra.target_message_id == target.message_id
