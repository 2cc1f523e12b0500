"""MailboxNode configuration: the cursor key ring, the crash hook, limits and paths.

Every MailboxNode must verify the tokens every other one signed, so the ring is explicit
(``QIM_CURSOR_KEYS``) or one shared development file created once; the crash hook fires only at
its step, shard and offset; a reply is one Kafka record, so the frame budget is capped below the
broker's message limit.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from qim.agents.mailbox.options import (
    KAFKA_RECORD_BUDGET,
    CrashHook,
    MailboxOptions,
    load_cursor_keys,
)
from qim.core.sync import CursorClaims, sign_cursor, verify_cursor
from qim.params import Settings

SECRET = base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER = base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()
CLAIMS = CursorClaims("t", "u", "d", 1, 2, 1, 0)


def test_ring_from_env_first_key_signs_every_key_verifies() -> None:
    old = load_cursor_keys({"QIM_CURSOR_KEYS": f"old:{SECRET}"})
    ring = load_cursor_keys({"QIM_CURSOR_KEYS": f"new:{OTHER}, old:{SECRET}"})
    assert ring.active_kid == "new"
    assert verify_cursor(sign_cursor(CLAIMS, old), ring) == CLAIMS
    with pytest.raises(ValueError):
        load_cursor_keys({"QIM_CURSOR_KEYS": "no-secret"})


def test_dev_ring_is_created_once_private_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "run" / "cursor-keys"
    first = load_cursor_keys({"QIM_CURSOR_KEYS_FILE": str(path)})
    second = load_cursor_keys({}, dev_path=path)
    assert verify_cursor(sign_cursor(CLAIMS, first), second) == CLAIMS
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(path.parent) == ["cursor-keys"]


def test_crash_hook_fires_only_at_its_step_shard_and_offset() -> None:
    hook = CrashHook.from_env(
        {"QIM_MAILBOX_CRASH_AT": "committed", "QIM_MAILBOX_CRASH_SHARD": "3",
         "QIM_MAILBOX_CRASH_OFFSET": "10"}
    )  # fmt: skip
    assert hook.armed("committed", 3, 5, 10) and hook.armed("committed", 3, 10, 20)
    assert not hook.armed("written", 3, 5, 10)
    assert not hook.armed("committed", 4, 5, 10)
    assert not hook.armed("committed", 3, 11, 20)
    assert not CrashHook.from_env({}).armed("committed", 3, 0, 100)
    with pytest.raises(ValueError):
        CrashHook.from_env({"QIM_MAILBOX_CRASH_AT": "sometime"})


def test_options_from_env(tmp_path: Path) -> None:
    env = {
        "QIM_CURSOR_KEYS": f"k:{SECRET}",
        "QIM_MAILBOX_SHARD_EPOCH": "2",
        "QIM_MAILBOX_SWEEP_INTERVAL_S": "5",
        "QIM_MAILBOX_MAX_RECORDS": "50",
        "QIM_TENANT_OVERRIDES": '{"short": {"mailbox_retention_days": 2}}',
        "QIM_SHARD_LEASE_TTL": "9000",
        "QIM_WRITER_SELF_FENCE_DEADLINE": "7000",
        "QIM_WRITER_LEASE_RENEW_INTERVAL": "3000",
    }
    options = MailboxOptions.load(
        Settings.load(env=env), env, bootstrap="127.0.0.1:1", datadir=tmp_path
    )
    assert (options.shard_epoch, options.sweep_interval_s, options.max_records) == (2, 5.0, 50)
    assert options.config(7).retention_days("short") == 2
    assert options.config(7).retention_days("other") == 7
    assert options.session_timeout_ms == 9000 and options.heartbeat_interval_ms == 3000
    assert options.store_path(7) == tmp_path / "mailbox" / "shard-7"
    assert options.limits.max_frame_bytes == KAFKA_RECORD_BUDGET
    assert options.limits.max_bytes <= KAFKA_RECORD_BUDGET
    with pytest.raises(ValueError, match="shard_epoch"):
        MailboxOptions.load(
            Settings.load(env={}), {**env, "QIM_MAILBOX_SHARD_EPOCH": "0"},
            bootstrap="x", datadir=tmp_path,
        )  # fmt: skip
