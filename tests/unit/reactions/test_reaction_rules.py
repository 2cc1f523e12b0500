"""REACT refusals, the push merge window and the SDK's version gate (13.6.2-13.6.3, A.6)."""

from __future__ import annotations

from qim.client.reactions import ReactionState
from qim.core.conversation import Duplicate, Reacted, Rejected
from qim.core.history import decode_message_record, message_key
from qim.core.reactions.push import ReactionPushMerge, push_records
from qim.schemas.events import EventType
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.history import HistoryBatch, HistoryMessage
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.frames.reactions import MessageReactions, ReactionUpdate
from qim.schemas.records import ReactRequest
from qim.schemas.records.outbox import MessageReacted
from tests.unit.history.support import C, T
from tests.unit.reactions.test_reaction_model import NOW, TARGET, _System


def _request(
    user: str = "u1", *, seq: int = 1, key: str = "like", action: str = "add"
) -> ReactRequest:
    return ReactRequest(
        tenant_id=T,
        user_id=user,
        device_id="d1",
        session_epoch=1,
        connection_shard=0,
        request_id=77,
        conversation_id=C,
        conversation_seq=seq,
        reaction_key=key,
        action=action,
    )


def _decide(system: _System, request: ReactRequest, now: int, *, member: bool = True) -> object:
    raw = system.store.get(message_key(T, C, request.conversation_seq))
    original = None if raw is None else decode_message_record(raw)
    target = TARGET if member else None
    return system.state.handle_react(
        request, now, target, original, system.store, visible=(0, None)
    )


def _code(decision: object) -> int:
    assert isinstance(decision, Rejected)
    assert decision.reply.error is not None and decision.reply.error.request_id == 77
    return decision.reply.error.code


def test_13_6_2_a_non_member_and_a_missing_or_recalled_target_get_permission_denied() -> None:
    system = _System()
    assert _code(_decide(system, _request(), NOW, member=False)) == ErrorCode.PERMISSION_DENIED
    assert _code(_decide(system, _request(seq=99), NOW)) == ErrorCode.PERMISSION_DENIED
    system.recall(1)
    assert _code(_decide(system, _request(seq=1), NOW)) == ErrorCode.PERMISSION_DENIED


def test_A3_18_a_malformed_react_gets_its_spec_code_and_changes_nothing() -> None:
    system = _System()
    assert _code(_decide(system, _request(action="toggle"), NOW)) == ErrorCode.UPGRADE_REQUIRED
    assert _code(_decide(system, _request(key=""), NOW)) == ErrorCode.PERMISSION_DENIED
    assert _code(_decide(system, _request(key="x" * 65), NOW)) == ErrorCode.PAYLOAD_TOO_LARGE
    assert not any(isinstance(r, MessageReacted) for r in system.log)


def test_13_6_3_per_user_reaction_rate_is_five_a_second_and_no_ops_cost_nothing() -> None:
    system = _System()
    keys = ("a", "b", "c", "d", "e")
    for key in keys:
        decision = _decide(system, _request(key=key), NOW)
        assert isinstance(decision, Reacted)
        system._commit(decision.record)
    assert isinstance(_decide(system, _request(key="a"), NOW), Duplicate)  # a no-op succeeds
    refused = _decide(system, _request(key="f"), NOW)
    assert _code(refused) == ErrorCode.RATE_LIMITED
    assert isinstance(refused, Rejected) and refused.reply.error is not None
    assert (refused.reply.error.retry_after_ms or 0) > 0
    assert isinstance(_decide(system, _request("u2", key="f"), NOW), Reacted)  # per user
    assert isinstance(_decide(system, _request(key="f"), NOW + 1_000), Reacted)


def _reacted(
    version: int, user: str, counts: dict[str, int], mine: tuple[str, ...]
) -> MessageReacted:
    return MessageReacted(
        tenant_id=T,
        conversation_id=C,
        conversation_kind="group",
        target_conversation_seq=1,
        target_message_id=b"\x01" * 16,
        user_id=user,
        reaction_key="like",
        action="add",
        counts=counts,
        summary_version=version,
        self_reaction_keys=mine,
        member_count=3,
        committed_at=NOW + version,
    )


def test_13_6_3_a_window_sends_the_last_absolute_frame_once_with_each_reactors_keys() -> None:
    merge = ReactionPushMerge(2_000)
    assert merge.offer(_reacted(1, "u1", {"like": 1}, ("like",)), 0) == 0
    assert merge.offer(_reacted(2, "u2", {"like": 2}, ("like",)), 500) == 1
    assert merge.offer(_reacted(3, "u1", {"heart": 1, "like": 2}, ("heart", "like")), 1_999) == 1
    assert merge.due(1_999) == [] and merge.next_due_ms() == 2_000
    (merged,) = merge.due(2_000)
    assert len(merge) == 0 and merge.due(10_000) == []
    records = push_records(merged, ["u3", "u1", "u2", "u1"], lambda u: 0 if u == "u3" else 1)
    assert [(r.connection_shard, r.recipients) for r in records] == [
        (0, ("u3",)),
        (1, ("u1", "u2")),
    ]
    assert all(r.summary_version == 3 and r.counts == {"heart": 1, "like": 2} for r in records)
    assert records[1].update_for("u1").self_reaction_keys == ("heart", "like")
    assert records[1].update_for("u2").self_reaction_keys == ("like",)
    assert records[0].update_for("u3").self_reaction_keys is None  # "yours did not change"


def test_13_6_2_the_sdk_applies_only_newer_versions_and_keeps_its_keys_when_omitted() -> None:
    state = ReactionState()

    def frame(version: int, counts: dict[str, int], mine: tuple[str, ...] | None) -> ReactionUpdate:
        return ReactionUpdate(
            conversation_id=C,
            conversation_seq=1,
            counts=counts,
            summary_version=version,
            self_reaction_keys=mine,
        )

    assert state.apply(frame(2, {"like": 2}, ("like",)))
    for _ in range(100):  # 26.3.8: the same frame 100 times
        assert not state.apply(frame(2, {"like": 2}, ("like",)))
    assert not state.apply(frame(1, {"like": 1}, None))  # older: dropped
    assert state.apply(frame(5, {"like": 3}, None))
    held = state.get(C, 1)
    assert held is not None
    assert (held.counts, held.summary_version, held.self_reaction_keys) == (
        {"like": 3},
        5,
        ("like",),
    )
    assert not state.apply(frame(4, {"like": 3, "heart": 1}, ("heart", "like")))  # late reply
    held = state.get(C, 1)
    assert held is not None and held.self_reaction_keys == ("heart", "like")
    assert held.counts == {"like": 3}  # the counts stay the newest


def test_13_6_4_a_history_page_with_the_message_recalled_drops_the_sdks_aggregate() -> None:
    state = ReactionState()
    state.apply(
        ReactionUpdate(conversation_id=C, conversation_seq=1, counts={"a": 1}, summary_version=1)
    )
    joined = MessageReactions(counts={"a": 2}, summary_version=2, self_reaction_keys=("a",))
    page = HistoryBatch(
        messages=(
            HistoryMessage(conversation_seq=1, sender_id="u1", state="RECALLED"),
            HistoryMessage(conversation_seq=2, sender_id="u1", reactions=joined),
        )
    )
    assert state.apply_history(C, page) == 1
    assert state.get(C, 1) is None
    held = state.get(C, 2)
    assert held is not None and held.counts == {"a": 2} and held.self_reaction_keys == ("a",)


def test_18_3_1_the_sdk_applies_mailbox_entries_aggregates_newer_only_and_keeps_its_keys() -> None:
    state = ReactionState()
    state.apply(
        ReactionUpdate(
            conversation_id=C,
            conversation_seq=1,
            counts={"a": 1},
            summary_version=1,
            self_reaction_keys=("a",),
        )
    )

    def entry(seq: int, version: int, counts: dict[str, int], kind: EventType) -> SyncEntry:
        joined = MessageReactions(counts=counts, summary_version=version)
        return SyncEntry(event_type=kind, conversation_id=C, conversation_seq=seq, reactions=joined)

    entries = [
        entry(1, 3, {"a": 2}, EventType.MESSAGE),
        entry(1, 2, {"a": 9}, EventType.MESSAGE),  # older: dropped
        entry(2, 1, {"b": 1}, EventType.CONTROL),  # only message entries carry one
        SyncEntry(event_type=EventType.MESSAGE, conversation_id=C, conversation_seq=3),
    ]
    assert state.apply_entries(entries) == 1
    held = state.get(C, 1)
    assert held is not None and (held.counts, held.summary_version) == ({"a": 2}, 3)
    assert held.self_reaction_keys == ("a",)  # the shard knows no one's keys: held ones stay
    assert state.get(C, 2) is None and state.get(C, 3) is None
