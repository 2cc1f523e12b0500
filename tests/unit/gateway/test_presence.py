"""The PresenceEntry record of the compacted presence topic (§5.4.2, §7.10)."""

from __future__ import annotations

import pytest

from qim.schemas import mailbox_shard_id, user_bucket
from qim.schemas.records.presence import (
    PresenceEntry,
    PresenceKey,
    decode_presence,
    encode_presence,
)


def test_key_is_the_canonical_tuple_encoding_and_round_trips() -> None:
    key = PresenceKey("t1", "u42", "phone")
    assert key.encode() == b"t1\x00u42\x00phone"
    assert PresenceKey.decode(key.encode()) == key


def test_partition_is_the_users_mailbox_shard() -> None:
    """Spec §5.2 worked example: t1/u42 -> bucket 34290 -> shard 242 of 256, 50 of 64."""
    key = PresenceKey("t1", "u42", "any-device")
    assert key.partition(virtual_bucket_count=65536, mailbox_shard_count=256) == 242
    assert key.partition(virtual_bucket_count=65536, mailbox_shard_count=64) == mailbox_shard_id(
        user_bucket("t1", "u42"), 64
    )


def test_value_round_trips_and_null_is_a_tombstone() -> None:
    entry = PresenceEntry(
        tenant_id="t1", user_id="u1", device_id="d1", connection_id="c-1", node_id="n1",
        connection_shard=7, session_epoch=3, capabilities=5, lease_expire_at=123,
    )  # fmt: skip
    assert decode_presence(encode_presence(entry)) == entry
    assert decode_presence(None) is None
    assert entry.key == PresenceKey("t1", "u1", "d1")


def test_bad_keys_are_rejected() -> None:
    with pytest.raises(ValueError):
        PresenceKey("t\x00", "u", "d").encode()


def test_an_entry_past_its_lease_counts_as_offline_5_4_3() -> None:
    entry = PresenceEntry(
        tenant_id="t1", user_id="u1", device_id="d1", connection_id="c-1", node_id="n1",
        connection_shard=7, session_epoch=3, lease_expire_at=10_000,
    )  # fmt: skip
    assert entry.is_online(9_999)
    assert not entry.is_online(10_000)
    assert not entry.is_online(50_000)
