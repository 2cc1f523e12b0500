"""User routing: buckets, shard masks, lanes and config constraints (spec §5.2, §6.5.1, B.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qim.schemas.routing import (
    ShardConfig,
    connection_shard_id,
    is_power_of_two,
    lane_id,
    mailbox_shard_id,
    user_bucket,
    user_routing_input,
    validate_shard_config,
)

ids = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1)
pow2_exponents = st.integers(0, 16)


def test_spec_5_2_worked_example_t1_u42() -> None:
    # Constants are the spec's published numbers, not derived from our code.
    assert user_routing_input("t1", "u42") == bytes.fromhex("743100753432")
    assert user_bucket("t1", "u42") == 34290 == 0x85F2
    assert user_bucket("t1", "u42", 65536) == 5698968781396936178 & 0xFFFF
    assert mailbox_shard_id(34290, 256) == 242
    assert connection_shard_id(34290, 1024) == 498
    assert 498 & 255 == 242
    assert lane_id("t1", "u42", 64) == 15
    assert lane_id("t1", "u42") == 0x4F & 63


def test_spec_5_5_2_split_bucket_34290_moves_to_shard_498_of_512() -> None:
    assert mailbox_shard_id(user_bucket("t1", "u42"), 512) == 0x1F2 == 498


def test_lane_uses_digest_byte_0_so_lane_256_is_the_whole_byte() -> None:
    assert lane_id("t1", "u42", 256) == 0x4F


@given(ids, ids, st.integers(0, 10), st.integers(0, 6))
def test_connection_shard_nests_inside_mailbox_shard_per_spec_5_2_constraint_2(
    tenant: str, user: str, mailbox_exp: int, extra_exp: int
) -> None:
    mailbox_count = 1 << mailbox_exp
    connection_count = mailbox_count << extra_exp
    bucket = user_bucket(tenant, user)
    conn = connection_shard_id(bucket, connection_count)
    assert conn & (mailbox_count - 1) == mailbox_shard_id(bucket, mailbox_count)


@given(ids, ids)
def test_bucket_and_lane_are_in_range_and_deterministic(tenant: str, user: str) -> None:
    bucket = user_bucket(tenant, user)
    assert 0 <= bucket < 65536
    assert bucket == user_bucket(tenant, user)
    assert 0 <= lane_id(tenant, user) < 64


@given(ids, ids, st.integers(0, 8))
def test_lane_is_independent_of_bucket_count_per_spec_6_5_1(
    tenant: str, user: str, exp: int
) -> None:
    # Lane derives from byte 0 only, never from user_bucket: shard splits cannot move a lane.
    lanes = 1 << exp
    assert lane_id(tenant, user, lanes) == lane_id(tenant, user, 256) & (lanes - 1)


@pytest.mark.parametrize(("tenant", "user"), [("", "u42"), ("t1", ""), ("t\x001", "u42")])
def test_invalid_ids_are_rejected(tenant: str, user: str) -> None:
    with pytest.raises(ValueError):
        user_bucket(tenant, user)
    with pytest.raises(ValueError):
        lane_id(tenant, user)


@pytest.mark.parametrize("count", [0, -4, 3, 100, 65535])
def test_non_power_of_two_counts_are_rejected(count: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        user_bucket("t1", "u42", count)
    with pytest.raises(ValueError, match="power of two"):
        mailbox_shard_id(1, count)
    with pytest.raises(ValueError, match="power of two"):
        connection_shard_id(1, count)
    with pytest.raises(ValueError, match="power of two"):
        lane_id("t1", "u42", count)


def test_lane_count_above_256_is_rejected_per_app_b1() -> None:
    with pytest.raises(ValueError):
        lane_id("t1", "u42", 512)


def test_negative_bucket_is_rejected() -> None:
    with pytest.raises(ValueError):
        mailbox_shard_id(-1, 256)


def test_default_config_is_valid_per_app_b1() -> None:
    validate_shard_config(65536, 256, 1024, 64)
    validate_shard_config(65536, 64, 1024, 64)  # starter tier
    assert ShardConfig() == ShardConfig(65536, 256, 1024, 64)


@pytest.mark.parametrize(
    ("vbc", "msc", "csc", "lanes", "reason"),
    [
        (65535, 256, 1024, 64, "power of two"),
        (65536, 255, 1024, 64, "power of two"),
        (65536, 256, 1000, 64, "power of two"),
        (65536, 256, 1024, 48, "power of two"),
        (256, 512, 512, 64, "mailbox_shard_count must be <="),
        (512, 256, 1024, 64, "connection_shard_count must be <="),
        (65536, 1024, 256, 64, "integer multiple"),
        (65536, 256, 1024, 512, "lane_count"),
        (1 << 65, 256, 1024, 64, "2\\*\\*64"),
    ],
)
def test_config_violations_of_spec_5_2_are_rejected(
    vbc: int, msc: int, csc: int, lanes: int, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        validate_shard_config(vbc, msc, csc, lanes)
    with pytest.raises(ValueError, match=reason):
        ShardConfig(vbc, msc, csc, lanes)


@given(pow2_exponents, pow2_exponents, pow2_exponents, st.integers(0, 9))
def test_config_accepted_iff_spec_5_2_constraints_hold(
    vbc_exp: int, msc_exp: int, csc_exp: int, lane_exp: int
) -> None:
    ok = msc_exp <= vbc_exp and csc_exp <= vbc_exp and csc_exp >= msc_exp and lane_exp <= 8
    args = (1 << vbc_exp, 1 << msc_exp, 1 << csc_exp, 1 << lane_exp)
    if ok:
        validate_shard_config(*args)
    else:
        with pytest.raises(ValueError):
            validate_shard_config(*args)


def test_is_power_of_two() -> None:
    assert [n for n in range(-2, 70) if is_power_of_two(n)] == [1, 2, 4, 8, 16, 32, 64]
    assert not is_power_of_two(True)
