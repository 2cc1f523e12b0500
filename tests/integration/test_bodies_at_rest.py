"""Bodies encrypted at rest (issue 22, spec 21.3.1, 21.3.4; topology.md decision 44).

Real pieces: the test stack's Kafka, ``faust worker``s of ``qim.apps.conversation`` and
``qim.apps.mailbox``, an in-process syncing gateway, SDK clients. ann sends ben a message with a
unique plaintext, then edits it to a second unique plaintext. Recipients read both in clear
everywhere a body or preview reaches them: PUSH_EVENTS to ben's online phone, a fresh login's
MAILBOX_BATCH, PULL_HISTORY and the session list's preview. The replay tools and the dispatch
audit still pass. Then, with the workers stopped (their stores closed), every Kafka log segment
of the broker's data dir and every file of both workers' RocksDB dirs is searched for the two
plaintexts: neither is anywhere. A positive control keeps the search honest: the same files do
hold this test's tenant id, which is stored in clear beside the bodies.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from qim.devstack.stack import Stack
from qim.schemas.frames import PushEvents, SyncEntry
from tests.integration.device_support import eventually, login
from tests.integration.login_support import syncing_gateway
from tests.integration.mailbox_support import WORKER_ENV, shard_of
from tests.integration.mailbox_support import Client as MailboxProbe
from tests.integration.mailbox_support import Node as MailboxWorker
from tests.integration.test_admin_groups import WRITER_ENV, writer_serving
from tests.integration.workers import FaustWorker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def files_holding(root: Path, needle: bytes, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """Every file under ``root`` (with one of ``suffixes``, if given) whose bytes hold
    ``needle``."""
    found = []
    # os.walk, not rglob: a topic the broker deletes meanwhile (its "-delete" folder) would
    # make rglob raise; os.walk skips a folder that vanished
    paths = (Path(d) / f for d, _, files in os.walk(root) for f in files)
    for path in paths:
        if not path.is_file() or (suffixes and not path.name.endswith(suffixes)):
            continue
        try:
            if needle in path.read_bytes():
                found.append(path)
        except OSError:
            continue  # removed while we walked (a compaction)
    return found


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def tool(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.cfg.env(), **WORKER_ENV}
    return subprocess.run(
        [sys.executable, "-m", "qim.cli", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, check=False,
    )  # fmt: skip


async def pushed_body(result: object, seq: int, conversation_id: str) -> SyncEntry:
    """The first PUSH_EVENTS entry of ``conversation_id`` at ``seq`` the device receives."""
    client = result.client  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while loop.time() < deadline:
        try:
            frame = await client.next_event(timeout=0.5)
        except TimeoutError:
            continue
        if isinstance(frame.body, PushEvents):
            for entry in frame.body.events:
                if entry.conversation_id == conversation_id and entry.conversation_seq == seq:
                    return entry
    raise AssertionError("no PUSH_EVENTS entry for the message")


async def test_no_plaintext_body_at_rest_and_recipients_read_it_in_clear(
    stack: Stack, tmp_path: Path
) -> None:
    tenant = f"t-rest-{uuid.uuid4().hex[:8]}"
    marker = f"plain-{uuid.uuid4().hex}".encode()
    edited = f"edited-{uuid.uuid4().hex}".encode()
    writer = FaustWorker(stack, "qim.apps.conversation", tmp_path / "conversation", WRITER_ENV)
    mailbox = MailboxWorker(stack, tmp_path / "mailbox")
    try:
        await asyncio.gather(asyncio.to_thread(writer.start), mailbox.start())
        await asyncio.gather(writer_serving(writer), mailbox.serving(60.0))
        async with (
            MailboxProbe(stack.cfg.kafka.bootstrap) as probe,
            syncing_gateway(stack, "gw-rest") as gw,
        ):
            ann = await login(gw, tenant, "ann", "pc")
            phone = await login(gw, tenant, "ben", "phone")
            direct = ann.client.direct_conversation_id("ben")
            ack = await ann.client.send_message(direct, marker, peer_user_id="ben")
            seq = ack.conversation_seq

            # PUSH_EVENTS to the online recipient: the body in clear
            pushed = await pushed_body(phone, seq, direct)
            assert pushed.payload_or_ciphertext == marker

            # MAILBOX_BATCH of a fresh login
            tablet = await login(gw, tenant, "ben", "tablet")
            synced = [e for e in tablet.entries if e.conversation_seq == seq and e.body_included]
            assert [e.payload_or_ciphertext for e in synced] == [marker], tablet.entries
            await tablet.client.close()

            # HISTORY_BATCH, for the sender and the recipient
            for reader in (ann, phone):
                page = await reader.client.pull_history(direct, limit=10)
                bodies = {m.conversation_seq: m.payload_or_ciphertext for m in page.messages}
                assert bodies[seq] == marker

            # the session list's preview (filled at read time from the sealed copy)
            async def preview_is(expected: bytes) -> bool:
                rows = {e.conversation_id: e for e in await probe.session_list(tenant, "ben")}
                row = rows.get(direct)
                return row is not None and row.preview_or_placeholder == expected

            await eventually(lambda: preview_is(marker), "the message's preview in clear")

            # an edit: its new body and preview are sealed too, and read in clear
            edit_ack = await ann.client.edit(direct, seq, edited)
            page = await phone.client.pull_history(direct, limit=10)
            bodies = {m.conversation_seq: m.payload_or_ciphertext for m in page.messages}
            assert bodies[seq] == edited
            await eventually(lambda: preview_is(edited), "the edit's preview in clear")
            late = await login(gw, tenant, "ben", "laptop")
            shown = {
                e.conversation_seq: e.payload_or_ciphertext for e in late.entries if e.body_included
            }
            # an inline entry keeps its first text (entries are immutable, 13.4.2); the edit's
            # CONTROL entry carries the new one, opened at the target's seq
            assert shown.get(seq) in (marker, edited)
            assert shown.get(edit_ack.conversation_seq) == edited
            await late.client.close()

            # the DEK cache metrics of both decrypt points
            for port in (writer.web_port, mailbox.worker.web_port):
                text = scrape(port)
                for name in ("qim_dek_cache_hits", "qim_dek_cache_misses", "qim_dek_cache_bytes"):
                    assert name in text, (port, name)
            assert 'qim_bodies_sealed_total{process="conversation"}' in scrape(writer.web_port)

            # the replay tools and the dispatch audit work on ciphertext
            shard = shard_of(tenant, "ben")
            datadir = str(mailbox.worker.datadir)
            replayed = await asyncio.to_thread(
                tool, stack, "replay", "projections", "--shard", str(shard), "--datadir", datadir
            )
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr
            audit = await asyncio.to_thread(
                tool, stack, "audit", "dispatch", "--bootstrap", stack.cfg.kafka.bootstrap,
                "--datadir", datadir, "--tenant", tenant, "--timeout", "150",
            )  # fmt: skip
            assert audit.returncode == 0, audit.stdout + audit.stderr
            for result in (ann, phone):
                await result.client.close()
    finally:
        await asyncio.gather(asyncio.to_thread(writer.stop), mailbox.stop(), return_exceptions=True)

    # stores closed: search every Kafka log segment and every RocksDB file
    segments = stack.cfg.kafka.data_dir
    stores = [writer.datadir, mailbox.worker.datadir]
    assert files_holding(segments, tenant.encode(), (".log",)), "control: tenant in segments"
    for store in stores:
        assert files_holding(store, tenant.encode()), f"control: tenant in {store}"
    for plaintext in (marker, edited):
        assert files_holding(segments, plaintext) == []
        for store in stores:
            assert files_holding(store, plaintext) == []
