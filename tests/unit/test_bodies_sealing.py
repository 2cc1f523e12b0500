"""The encrypt and decrypt points of topology.md decision 44 (spec 21.3.1, 21.3.4), without Kafka:
what the writer seals, what the read points open, what stays untouched, and the transit seal."""

from __future__ import annotations

import msgspec
import pytest

from qim.agents.keyring import BodyKeys, new_version, opened_entry
from qim.agents.writer.sealing import sealed_record
from qim.core.fanout.build import message_dispatch
from qim.core.keys import (
    EXPIRED_PLACEHOLDER,
    DekId,
    KeyDestroyed,
    KeyRing,
    KeyScope,
    is_sealed,
    new_wrapped,
)
from qim.core.mailbox.session_store import PREVIEW_BYTES, facts_of
from qim.schemas.frames import SyncEntry
from qim.schemas.records import MessageAmended, MessageCommitted
from qim.streams.transit import TransitError, TransitSealer

T, C = "t1", "d:alice:bob"
ROOT = bytes(range(32))


def keys_with_conversation_key(conversation_id: str = C) -> BodyKeys:
    """A process's keys after it folded a TMK and the conversation's DEK (what the writer's
    ``ensure_conversation_keys`` produces)."""
    keys = BodyKeys(ROOT, dek_cache_ttl_ms=300_000)
    tmk = KeyRing.tmk_id(T, new_version(1_000))
    keys.apply(new_wrapped(ROOT, T, tmk, parent_version=0, created_at=1_000))
    cdek = DekId(KeyScope.CONVERSATION, conversation_id, new_version(1_000))
    parent = keys.ring.dek(T, tmk)
    keys.apply(new_wrapped(parent, T, cdek, parent_version=tmk.key_version, created_at=1_000))
    return keys


def message(payload: bytes, *, seq: int = 7, e2ee: bool = False) -> MessageCommitted:
    return MessageCommitted(
        tenant_id=T, conversation_id=C, conversation_kind="direct", participants=("alice", "bob"),
        message_id=bytes(15) + b"\x07", conversation_seq=seq, last_activity_id=bytes(15) + b"\x07",
        sender_id="alice", origin_device_id="pc", payload=payload, member_count=2,
        committed_at=1_700_000_000_000, e2ee=e2ee,
    )  # fmt: skip


def edit(new_payload: bytes, *, target_seq: int = 7, seq: int = 9) -> MessageAmended:
    return MessageAmended(
        tenant_id=T, conversation_id=C, conversation_kind="direct", participants=("alice", "bob"),
        message_id=bytes(15) + b"\x09", conversation_seq=seq, last_activity_id=bytes(15) + b"\x09",
        sender_id="alice", action="edit", target_message_id=bytes(15) + b"\x07",
        target_conversation_seq=target_seq, target_sender_id="alice", new_payload=new_payload,
        preview_or_placeholder=new_payload, member_count=2, committed_at=1_700_000_000_000,
    )  # fmt: skip


def test_a_message_body_and_its_preview_are_sealed_and_open_only_at_their_position() -> None:
    keys = keys_with_conversation_key()
    text = b"hello " * 100
    sealed = sealed_record(keys, message(text), e2ee=False)
    assert isinstance(sealed, MessageCommitted)
    assert is_sealed(sealed.payload) and text not in sealed.payload
    assert keys.open(sealed.payload, T, C, (7,)) == text
    assert keys.open(sealed.payload, T, C, (8,)) == EXPIRED_PLACEHOLDER  # AAD: another seq
    assert keys.open(sealed.payload, T, "d:alice:carol", (7,)) == EXPIRED_PLACEHOLDER
    assert keys.open_preview(sealed.sealed_preview, T, C) == text[:PREVIEW_BYTES]
    assert keys.open(sealed.sealed_preview, T, C, (7,)) == EXPIRED_PLACEHOLDER  # not a body


def test_e2ee_bodies_pass_through_by_the_flag_not_by_their_bytes() -> None:
    keys = keys_with_conversation_key()
    client_ciphertext = b"QE1-looks-like-our-magic-but-is-the-client's"
    record = message(client_ciphertext, e2ee=True)
    assert sealed_record(keys, record, e2ee=True) is record
    assert sealed_record(keys, record, e2ee=False) is record  # the record's own flag holds too
    amend = edit(b"client ciphertext")
    assert sealed_record(keys, amend, e2ee=True) is amend


def test_an_edit_is_sealed_at_its_target_and_its_control_entry_opens_there() -> None:
    keys = keys_with_conversation_key()
    sealed = sealed_record(keys, edit(b"new text"), e2ee=False)
    assert isinstance(sealed, MessageAmended)
    assert keys.open(sealed.new_payload, T, C, (7,)) == b"new text"
    assert keys.open_preview(sealed.preview_or_placeholder, T, C) == b"new text"
    control = SyncEntry(
        conversation_id=C, conversation_seq=9, target_conversation_seq=7, body_included=True,
        payload_or_ciphertext=sealed.new_payload,
    )  # fmt: skip
    assert opened_entry(keys, T, control).payload_or_ciphertext == b"new text"


def test_a_destroyed_key_reads_as_the_expired_placeholder_and_leaves_the_cache() -> None:
    keys = keys_with_conversation_key()
    sealed = sealed_record(keys, message(b"secret"), e2ee=False)
    assert isinstance(sealed, MessageCommitted)
    entry = SyncEntry(
        conversation_id=C, conversation_seq=7, body_included=True,
        payload_or_ciphertext=sealed.payload,
    )  # fmt: skip
    assert opened_entry(keys, T, entry).payload_or_ciphertext == b"secret"
    assert len(keys.cache) == 1
    dek_id = keys.conversation_key(T, C)
    assert dek_id is not None
    keys.apply(
        KeyDestroyed(
            tenant_id=T, key_scope=int(dek_id.key_scope), key_id=dek_id.key_id,
            key_version=dek_id.key_version,
        )
    )  # fmt: skip
    assert len(keys.cache) == 0
    assert opened_entry(keys, T, entry).payload_or_ciphertext == EXPIRED_PLACEHOLDER
    assert keys.expired == 1
    plain = SyncEntry(conversation_id=C, conversation_seq=8, payload_or_ciphertext=b"legacy")
    assert opened_entry(keys, T, plain) is plain  # no envelope: served as stored


def test_sealing_without_a_durable_key_is_refused() -> None:
    keys = BodyKeys(ROOT, dek_cache_ttl_ms=1000)
    with pytest.raises(LookupError):
        sealed_record(keys, message(b"x"), e2ee=False)


def test_the_mailbox_keeps_the_sealed_preview_whole_and_never_slices_ciphertext() -> None:
    keys = keys_with_conversation_key()
    sealed = sealed_record(keys, message(b"y" * 1000), e2ee=False)
    assert isinstance(sealed, MessageCommitted)
    dispatch = message_dispatch(sealed, 0)
    facts = facts_of(dispatch, mailbox_seq=1)
    assert facts.preview == sealed.sealed_preview
    assert keys.open_preview(facts.preview, T, C) == b"y" * PREVIEW_BYTES
    bare = msgspec.structs.replace(dispatch, preview_or_placeholder=b"")
    assert facts_of(bare, mailbox_seq=1).preview == b""  # not a slice of the sealed payload


def test_key_versions_of_two_creators_differ_and_follow_creation_time() -> None:
    assert len({new_version(5) for _ in range(50)}) > 45
    assert new_version(6) > new_version(5)


def test_the_transit_seal_round_trips_and_passes_unsealed_values_through() -> None:
    sealer = TransitSealer(bytes(32))
    sealed = sealer.seal(b"reply with a body")
    assert b"reply with a body" not in sealed
    assert sealer.open(sealed) == b"reply with a body"
    assert sealer.open(b"plain record") == b"plain record"
    with pytest.raises(TransitError):
        TransitSealer(bytes([1]) * 32).open(sealed)
    assert repr(sealer) == "TransitSealer()"  # the key never printed
