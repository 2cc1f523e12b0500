"""Spec 13.3 on the ConversationWriter: the type registry, the tenant's contract, the refusals.

Every refusal carries the spec's code and the request's ``request_id`` and leaves no trace
(nothing applied, the head unchanged); an accepted custom message carries its contract on the
commit record, so replay under a config with no declarations rebuilds the same state.
"""

from __future__ import annotations

import msgspec
import pytest

from qim.core.conversation import (
    Accepted,
    Amended,
    ConversationWriterState,
    Rejected,
    Transient,
    WriterConfig,
    replay,
)
from qim.core.conversation.custom_types import CustomTypeRegistry
from qim.core.history import (
    MemoryOrderedStore,
    MessageRecord,
    archive_batch,
    decode_message_record,
    message_key,
    write_all,
)
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.base import EntryFlags
from qim.schemas.message_types import (
    CLIENT_MESSAGE_TYPES,
    DEFAULT_MESSAGE_FLAGS,
    MessageType,
    decode_custom_types,
)
from qim.schemas.records import GROUP, AmendRequest, SendRequest
from qim.schemas.records.outbox import PreviewPlaceholder

from .support import (
    NOW,
    REGION,
    TENANT,
    WRITER,
    Groups,
    accepted,
    commit,
    config,
    contract,
    send_request,
    settings,
    typed_config,
    writer,
)

CUSTOM = MessageType.CUSTOM
SILENT = contract("state.sync", counts_unread=False, affects_session_order=False)
HIDDEN = contract(
    "prop.change",
    counts_unread=False,
    affects_session_order=False,
    timeline_visible=False,
    anchor_mode="none",
    schema_version=3,
)
STATUS = contract("order.status", anchor_mode="anchor_target", counts_unread=False)
SMALL = contract("card.small", max_payload_bytes=8)
TYPING_LIKE = contract("live.cursor", delivery_class="ephemeral", counts_unread=False)


def team() -> Groups:
    groups = Groups()
    groups.add("g:team", ["alice", "bob"])
    return groups


def typed_writer() -> ConversationWriterState:
    return writer(typed_config(SILENT, HIDDEN, STATUS, SMALL, TYPING_LIKE))


def custom(custom_type: str, payload: bytes = b"x", *, reply_to: int | None = None) -> SendRequest:
    return send_request(
        "alice",
        "g:team",
        f"cm-{custom_type}-{len(payload)}-{reply_to}",
        message_type=CUSTOM,
        custom_type=custom_type,
        payload=payload,
        request_id=77,
        reply_to=reply_to,
    )


def refused(decision: object, code: ErrorCode) -> Rejected:
    assert isinstance(decision, Rejected), decision
    error = decision.reply.error
    assert error is not None and error.code == code and error.request_id == 77, error
    assert error.detail  # says why, in words
    return decision


def test_an_undeclared_custom_type_is_refused_with_permission_denied_and_leaves_no_trace() -> None:
    state = typed_writer()
    decision = refused(
        commit(state, custom("card.unknown"), NOW, team()), ErrorCode.PERMISSION_DENIED
    )
    assert decision.reason == "custom_type_not_declared"
    assert state.head(TENANT, "g:team") is None


def test_declarations_are_per_tenant_and_star_covers_the_others() -> None:
    cfg = WriterConfig.from_settings(
        settings(), custom_types={TENANT: (SILENT,), "*": (contract("shared.card"),)}
    )
    state = writer(cfg)
    groups = team()
    groups.add("g:team", ["alice", "bob"], tenant="other")
    # "acme" has its own list (no "shared.card"), "other" falls back to "*"
    refused(commit(state, custom("shared.card"), NOW, groups), ErrorCode.PERMISSION_DENIED)
    other = send_request(
        "alice", "g:team", "cm-o", tenant="other", message_type=CUSTOM, custom_type="shared.card"
    )
    assert isinstance(commit(state, other, NOW, groups), Accepted)
    assert isinstance(commit(state, custom("state.sync"), NOW, groups), Accepted)


@pytest.mark.parametrize("message_type", [MessageType.CONTROL, 7, 0x42, 0xFE])
def test_a_server_only_or_unknown_message_type_from_a_client_is_refused(message_type: int) -> None:
    state = typed_writer()
    request = send_request("alice", "g:team", message_type=message_type, request_id=77)
    decision = refused(commit(state, request, NOW, team()), ErrorCode.PERMISSION_DENIED)
    assert decision.reason == "message_type_not_allowed"
    assert MessageType.CONTROL not in CLIENT_MESSAGE_TYPES


def test_a_control_event_disguised_with_a_server_custom_type_is_refused() -> None:
    """The recall / membership CONTROL types cannot be sent, nor declared by a tenant."""
    state = typed_writer()
    as_control = send_request(
        "alice",
        "g:team",
        message_type=MessageType.CONTROL,
        custom_type="qim.amend.v1",
        request_id=77,
    )
    refused(commit(state, as_control, NOW, team()), ErrorCode.PERMISSION_DENIED)
    as_custom = custom("qim.membership.v1")
    refused(commit(state, as_custom, NOW, team()), ErrorCode.PERMISSION_DENIED)
    with pytest.raises(msgspec.ValidationError, match="server"):
        decode_custom_types(msgspec.json.encode({TENANT: [_raw("qim.mine")]}))


def test_custom_type_only_with_message_type_custom_and_always_with_it() -> None:
    state = typed_writer()
    stray = send_request("alice", "g:team", message_type=1, custom_type="state.sync", request_id=77)
    assert refused(commit(state, stray, NOW, team()), ErrorCode.PERMISSION_DENIED).reason == (
        "custom_type_mismatch"
    )
    untyped = send_request("alice", "g:team", message_type=CUSTOM, request_id=77)
    refused(commit(state, untyped, NOW, team()), ErrorCode.PERMISSION_DENIED)


def test_a_payload_over_the_types_max_payload_bytes_is_payload_too_large() -> None:
    state = typed_writer()
    assert isinstance(commit(state, custom("card.small", b"12345678"), NOW, team()), Accepted)
    decision = refused(
        commit(state, custom("card.small", b"123456789"), NOW, team()), ErrorCode.PAYLOAD_TOO_LARGE
    )
    assert decision.reason == "payload_too_large"


def test_the_tenants_max_custom_payload_bytes_caps_every_type() -> None:
    cap = settings().max_custom_payload_bytes
    big = contract("big", max_payload_bytes=cap)
    state = writer(typed_config(big))
    assert isinstance(commit(state, custom("big", b"x" * cap), NOW, team()), Accepted)
    refused(
        commit(state, custom("big", b"x" * (cap + 1)), NOW, team()), ErrorCode.PAYLOAD_TOO_LARGE
    )
    with pytest.raises(ValueError, match="max_custom_payload_bytes"):
        typed_config(contract("huge", max_payload_bytes=cap + 1))


def transient(decision: object) -> Transient:
    assert isinstance(decision, Transient), decision
    return decision


def test_an_ephemeral_type_takes_the_transient_path_and_commits_nothing() -> None:
    """13.3 ``delivery_class=ephemeral`` -> 13.2: a SEND_ACK with no seq, an entry with no
    mailbox reference, no head, no ClientDedup entry, no admission token, no snapshot change."""
    state = typed_writer()
    before = state.snapshot()
    opaque = b"\xc1\xff not parsed"
    decision = transient(commit(state, custom("live.cursor", opaque), NOW, team()))
    assert state.snapshot() == before
    assert state.head(TENANT, "g:team") is None
    ack = decision.reply.send_ack
    assert ack is not None and decision.reply.error is None
    assert (ack.request_id, ack.conversation_seq, ack.last_activity_id) == (77, 0, bytes(16))
    assert ack.client_message_id == "cm-live.cursor-13-None"
    entry = decision.entry
    assert entry.message_id == ack.message_id != bytes(16)
    assert (entry.mailbox_seq, entry.conversation_seq, entry.flags) == (0, 0, 0)
    assert entry.last_activity_id == bytes(16)
    assert (entry.sender_id, entry.origin_device_id) == ("alice", "phone")
    assert entry.body_included and entry.payload_or_ciphertext == opaque
    assert (entry.message_type, entry.custom_type) == (CUSTOM, "live.cursor")
    assert entry.client_message_id == ack.client_message_id
    assert decision.target.kind == GROUP and decision.target.member_count == 2


def test_ephemeral_ids_are_unique_and_a_later_commit_sorts_above_them() -> None:
    """Same millisecond, no apply in between: each transient id is new, and the next
    committed message (seq 1: the transients took none) gets an id above all of them."""
    state = typed_writer()
    ids = []
    for i in range(3):
        request = send_request(
            "alice", "g:team", f"cm-e{i}", message_type=CUSTOM, custom_type="live.cursor"
        )
        ids.append(transient(commit(state, request, NOW, team())).entry.message_id)
    assert len(set(ids)) == 3 and ids == sorted(ids)
    record = accepted(commit(state, custom("state.sync"), NOW, team())).record
    assert record.conversation_seq == 1
    assert record.message_id > ids[-1]


def test_ephemeral_retries_are_not_deduplicated_and_admission_is_not_charged() -> None:
    """A retry is relayed again (nothing was committed to answer it from); a burst over the
    writer's L1/L2 budgets is still relayed (the gateway's per_user_msg_rate guards it)."""
    state = writer(typed_config(TYPING_LIKE))
    first = transient(commit(state, custom("live.cursor"), NOW, team()))
    again = transient(commit(state, custom("live.cursor"), NOW, team()))
    assert first.entry.message_id != again.entry.message_id
    for _ in range(200):
        transient(commit(state, custom("live.cursor"), NOW, team()))


def test_an_ephemeral_send_is_checked_like_any_send() -> None:
    state = typed_writer()
    stranger = send_request(
        "mallory", "g:team", message_type=CUSTOM, custom_type="live.cursor", request_id=77
    )
    denied = commit(state, stranger, NOW, team())
    assert isinstance(denied, Rejected) and denied.reason == "not_a_member"
    assert denied.code == ErrorCode.PERMISSION_DENIED
    big = custom("live.cursor", b"x" * (TYPING_LIKE.max_payload_bytes + 1))
    refused(commit(state, big, NOW, team()), ErrorCode.PAYLOAD_TOO_LARGE)


def test_an_ephemeral_send_above_the_large_group_threshold_is_refused_not_dropped() -> None:
    state = typed_writer()
    threshold = settings().large_group_member_threshold
    groups = team()
    groups.add("g:team", ["alice", "bob"], count=threshold + 1)
    decision = refused(
        commit(state, custom("live.cursor"), NOW, groups), ErrorCode.PERMISSION_DENIED
    )
    assert decision.reason == "ephemeral_large_group"
    error = decision.reply.error
    assert error is not None and "large_group_member_threshold" in error.detail
    groups.add("g:team", ["alice", "bob"], count=threshold)
    transient(commit(state, custom("live.cursor"), NOW, groups))


def test_the_commit_record_carries_the_contract_and_the_payload_untouched() -> None:
    state = typed_writer()
    opaque = b"\xc1\xff\x00not msgpack, not utf-8 \xfe"  # never parsed
    record = accepted(commit(state, custom("prop.change", opaque), NOW, team())).record
    assert record.payload == opaque
    assert record.flags == 0  # no unread, no move, not on the timeline
    assert (record.anchor_mode, record.schema_version) == ("none", 3)
    silent = accepted(commit(state, custom("state.sync"), NOW + 1, team())).record
    assert silent.flags == int(EntryFlags.TIMELINE_VISIBLE)
    preview = msgspec.msgpack.decode(silent.preview_or_placeholder, type=PreviewPlaceholder)
    assert preview == PreviewPlaceholder(
        message_type=CUSTOM, custom_type="state.sync", template="[state.sync]"
    )
    plain = accepted(commit(state, send_request("bob", "g:team", "p"), NOW + 2, team())).record
    assert (plain.flags, plain.anchor_mode, plain.schema_version) == (
        DEFAULT_MESSAGE_FLAGS,
        "own_seq",
        0,
    )
    # an ordinary record's bytes do not mention the new fields (old logs replay unchanged)
    assert b"anchor_mode" not in msgspec.msgpack.encode(plain)


def test_anchor_target_needs_an_earlier_seq_of_the_conversation() -> None:
    state = typed_writer()
    refused(commit(state, custom("order.status"), NOW, team()), ErrorCode.PERMISSION_DENIED)
    first = accepted(commit(state, send_request("bob", "g:team", "p"), NOW, team())).record
    refused(
        commit(state, custom("order.status", reply_to=first.conversation_seq + 1), NOW, team()),
        ErrorCode.PERMISSION_DENIED,
    )
    status = custom("order.status", reply_to=first.conversation_seq)
    record = accepted(commit(state, status, NOW + 1, team())).record
    assert record.anchor_mode == "anchor_target"
    assert record.reply_to_conversation_seq == first.conversation_seq


def test_replay_without_any_declaration_rebuilds_the_same_state() -> None:
    """The folds read the contract from the log, never from live config."""
    state = typed_writer()
    names = ["state.sync", "prop.change", "order.status", "card.small"]
    requests = [custom(n, reply_to=1 if n == "order.status" else None) for n in names]
    records = [accepted(commit(state, r, NOW + i, team())).record for i, r in enumerate(requests)]
    rebuilt = replay(records, config(), region_id=REGION, writer_id=WRITER, fencing_epoch=1)
    assert rebuilt.snapshot() == state.snapshot()


def _raw(custom_type: str, **fields: object) -> dict[str, object]:
    return {**msgspec.structs.asdict(contract("x")), "custom_type": custom_type, **fields}


def test_declarations_fail_loudly_on_a_missing_field_a_typo_or_a_bad_combination() -> None:
    ok = decode_custom_types(msgspec.json.encode({TENANT: [_raw("card")]}))
    assert [c.custom_type for c in ok[TENANT]] == ["card"]
    missing = _raw("card")
    del missing["counts_unread"]
    bad: list[object] = [
        [missing],
        [_raw("card", count_unread=True)],  # typo: unknown field
        [_raw("card", anchor_mode="none")],  # none needs timeline_visible=false
        [_raw("card", delivery_class="ephemeral_aggregate")],  # reactions are not custom types
        [_raw("card", anchor_mode="sideways")],
        [_raw("card"), _raw("card")],  # declared twice
    ]
    for contracts in bad:
        with pytest.raises(ValueError):
            decode_custom_types(msgspec.json.encode({TENANT: contracts}))
    with pytest.raises(ValueError, match="custom_type_max_bytes"):
        CustomTypeRegistry.build(
            {TENANT: (contract("x" * 65),)},
            max_payload_bytes={},
            default_max_payload_bytes=1024,
            custom_type_max_bytes=64,
        )


class Members(Groups):
    """``Groups`` with the amend path's role question: nobody is an admin here."""

    def is_admin(self, tenant_id: str, conversation_id: str, user_id: str) -> bool:
        return False


class Stored:
    """A typed writer and its MessageStore, for amends of custom messages."""

    def __init__(self) -> None:
        self.w = typed_writer()
        self.store = MemoryOrderedStore()

    def send(self, request: SendRequest) -> int:
        record = accepted(commit(self.w, request, NOW, team())).record
        write_all(self.store, archive_batch([record], read=self.store.get))
        return record.conversation_seq

    def amend(self, seq: int, action: str, payload: bytes = b"") -> object:
        request = AmendRequest(
            tenant_id=TENANT,
            user_id="alice",
            device_id="phone",
            session_epoch=7,
            connection_shard=3,
            request_id=9,
            action="edit" if action == "edit" else "recall",
            conversation_id="g:team",
            target_conversation_seq=seq,
            new_payload=payload,
        )

        def row(s: int) -> MessageRecord | None:
            raw = self.store.get(message_key(TENANT, "g:team", s))
            return None if raw is None else decode_message_record(raw)

        members = Members()
        members.add("g:team", ["alice", "bob"])
        return self.w.handle_amend(request, NOW + 1, members, row)


def test_a_recall_of_a_silent_type_carries_its_flags_so_nothing_is_decremented() -> None:
    c = Stored()
    seq = c.send(custom("state.sync"))
    decision = c.amend(seq, "recall")
    assert isinstance(decision, Amended), decision
    assert decision.record.target_flags == int(EntryFlags.TIMELINE_VISIBLE)  # no COUNTS_UNREAD


def test_an_edit_of_a_custom_message_is_bounded_by_its_types_payload_cap() -> None:
    c = Stored()
    seq = c.send(custom("card.small", b"1234"))
    too_big = c.amend(seq, "edit", b"123456789")
    assert isinstance(too_big, Rejected) and too_big.code == ErrorCode.PAYLOAD_TOO_LARGE
    assert isinstance(c.amend(seq, "edit", b"12345678"), Amended)
