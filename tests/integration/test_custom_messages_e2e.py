"""Custom messages end to end on the real stack (issue 16, spec 13.3).

Real ``faust worker`` processes of both apps (the writer started with ``QIM_CUSTOM_TYPES``), an
in-process syncing ConnectionNode, SDK clients over WebSocket. s0 sends dana, in their
one-to-one conversation, a text, a ``counts_unread=false`` type, a ``timeline_visible=false``
type and a closing text; the closing text's row is the positive barrier before any "did not
count" / "is not shown" check. The refusals (undeclared type, oversize payload, a CONTROL
``message_type``) are ERROR frames answering their own request; an ephemeral type is acked
with no seq (its transient path: ``test_realtime_ephemeral``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from qim.client import QimError, Timeline
from qim.devstack.stack import Stack
from qim.schemas.frames import ErrorCode
from qim.schemas.frames.base import EntryFlags
from qim.schemas.frames.history import SessionEntry
from qim.schemas.message_types import MessageType
from tests.integration.device_support import eventually, login
from tests.integration.login_support import pipeline, syncing_gateway
from tests.integration.mailbox_support import WORKER_ENV, shard_of
from tests.integration.mailbox_support import Client as MailboxProbe

pytestmark = pytest.mark.integration

ME = "dana"


def declaration(custom_type: str, **fields: object) -> dict[str, object]:
    return {
        "custom_type": custom_type,
        "schema_version": 1,
        "delivery_class": "persistent",
        "counts_unread": True,
        "affects_session_order": True,
        "timeline_visible": True,
        "anchor_mode": "own_seq",
        "preview_template": f"[{custom_type}]",
        "max_payload_bytes": 64,
        "minimum_client_version": "1.0",
        **fields,
    }


def custom_types(tenant: str) -> str:
    return json.dumps(
        {
            tenant: [
                declaration("shop.sync", counts_unread=False, affects_session_order=False),
                declaration(
                    "call.note",
                    counts_unread=False,
                    timeline_visible=False,
                    anchor_mode="none",
                ),
                declaration("live.cursor", delivery_class="ephemeral", counts_unread=False),
            ]
        }
    )


def replay_projections(datadir: Path, shard: int) -> subprocess.CompletedProcess[str]:
    """`qim replay projections` next to the running node (no QIM_CUSTOM_TYPES in its env)."""
    argv = [sys.executable, "-m", "qim.cli", "replay", "projections", "--shard", str(shard)]
    argv += ["--datadir", str(datadir)]
    env = {k: v for k, v in {**os.environ, **WORKER_ENV}.items() if k != "QIM_CUSTOM_TYPES"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)


async def test_custom_types_follow_their_contract_and_bad_ones_are_refused(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-cu-{uuid.uuid4().hex[:6]}"
    env = {"QIM_CUSTOM_TYPES": custom_types(tenant)}
    async with (
        pipeline(stack, tmp_path, env) as mailbox,
        MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
        syncing_gateway(stack, "gw-custom") as gw,
    ):
        s0 = await login(gw, tenant, "s0", "pc")
        phone = await login(gw, tenant, ME, "phone")
        tablet = None
        try:
            direct = s0.client.direct_conversation_id(ME)

            async def row() -> SessionEntry | None:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, ME)}
                return rows.get(direct)

            first = await s0.client.send_message(direct, b"hello", peer_user_id=ME)
            silent = await s0.client.send_custom(direct, "shop.sync", b"\x00{}", peer_user_id=ME)
            hidden = await s0.client.send_custom(direct, "call.note", b"\xff", peer_user_id=ME)
            last = await s0.client.send_message(direct, b"bye", peer_user_id=ME)

            async def barrier() -> bool:
                r = await row()
                return r is not None and r.latest_conversation_seq >= last.conversation_seq

            await eventually(barrier, "the closing text in dana's session list")
            shown = await row()
            assert shown is not None
            assert shown.unread_count == 2  # hello + bye; shop.sync and call.note count nothing
            assert shown.last_activity_id == last.last_activity_id

            # timeline_visible=false: in the mailbox, not in history
            history = await phone.client.pull_history(direct, direction="newer", limit=50)
            seqs = [m.conversation_seq for m in history.messages]
            assert seqs == [first.conversation_seq, silent.conversation_seq, last.conversation_seq]
            assert hidden.conversation_seq not in seqs
            by_seq = {e.conversation_seq: e for e in await probe.pull_all(tenant, ME)}
            note = by_seq[hidden.conversation_seq]
            assert note.custom_type == "call.note"
            assert not note.flags & EntryFlags.TIMELINE_VISIBLE
            assert by_seq[silent.conversation_seq].flags == int(EntryFlags.TIMELINE_VISIBLE)

            # `qim replay projections` rebuilds the list from the entries' flags, not config
            replayed = replay_projections(mailbox.worker.datadir, shard_of(tenant, ME))
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr
            assert ": identical" in replayed.stdout, replayed.stdout
            assert " 0 users" not in replayed.stdout, replayed.stdout

            # a new device applies the same entries with the SDK (types unknown to it)
            tablet = await login(gw, tenant, ME, "tablet")
            assert tablet.auth_ok.total_unread == 2  # the badge agrees
            timeline = Timeline(ME)
            timeline.apply(tablet.entries)
            local = timeline.conversations[direct]
            assert local.unread == 2
            assert sorted(local.rows) == seqs  # call.note has no row

            # refusals: each answers its own request with the spec's code
            with pytest.raises(QimError) as undeclared:
                await s0.client.send_custom(direct, "shop.unknown", b"x", peer_user_id=ME)
            assert undeclared.value.code == ErrorCode.PERMISSION_DENIED
            assert "not declared" in undeclared.value.detail
            with pytest.raises(QimError) as oversize:
                await s0.client.send_custom(direct, "shop.sync", b"x" * 65, peer_user_id=ME)
            assert oversize.value.code == ErrorCode.PAYLOAD_TOO_LARGE
            with pytest.raises(QimError) as control:
                await s0.client.send_message(
                    direct,
                    b"\x83\xa6action\xa6recall",
                    message_type=MessageType.CONTROL,
                    custom_type="qim.amend.v1",
                    peer_user_id=ME,
                )
            assert control.value.code == ErrorCode.PERMISSION_DENIED
            # an ephemeral type takes the transient path: acked, but it takes no seq
            ephemeral = await s0.client.send_custom(direct, "live.cursor", b"x", peer_user_id=ME)
            assert ephemeral.conversation_seq == 0 and ephemeral.message_id != bytes(16)
            # none of them was committed: the next message takes the very next seq
            after = await s0.client.send_message(direct, b"after", peer_user_id=ME)
            assert after.conversation_seq == last.conversation_seq + 1
        finally:
            for r in (s0, phone, tablet):
                if r is not None:
                    await r.client.close()
