"""``qim bench checkpoint``: what a takeover on an empty disk costs (spec 19.3.2, 26.6.3).

No stack: one MailboxShard store is built through the same fold the MailboxNode runs
(:class:`~qim.agents.mailbox.shard.OwnedShard`, one WriteBatch per ``batch`` dispatches of a
group whose members all live on the shard), then

1. checkpointed and shipped to a second folder (the node's ``checkpoint_dir``),
2. restored onto an empty path, opened and read (one member's mailbox page): the takeover's
   restore step, which a node does before it serves the shard,
3. the log's tail folded on top (``tail`` more dispatches): the replay after the checkpoint.

Reported per row: entries, store bytes, the fold rate while building (``replay_rate``), the
checkpoint's time and bytes (``checkpoint_bytes``), the restore time (``checkpoint load
time``), the tail's replay time, and their sum as the takeover's RTO on this machine against
``mailbox_takeover_rto_target``. The log reads of a real replay are not in it (a fetch of
``max_records`` per round from a local broker; ``qim bench send`` measures that path).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qim.agents.mailbox.shard import OwnedShard
from qim.core.mailbox import MailboxConfig
from qim.core.membership import bitmap_bytes
from qim.params import Settings
from qim.schemas import dispatch_id
from qim.schemas.records.dispatch import GroupDispatch, ShardLogRecord
from qim.schemas.records.membership import MemberSliceRecord
from qim.tables.mailbox_checkpoint import create_checkpoint, restore_checkpoint, ship_checkpoint
from qim.tables.mailbox_store import MailboxStore

__all__ = ["CheckpointParams", "run_checkpoint"]

_SHARD = 0
_TENANT = "bench-ckpt"
_GROUP = "g:bench-ckpt"
_CHUNK = 4096


@dataclass(frozen=True)
class CheckpointParams:
    entries: int = 1_000_000
    members: int = 5000
    batch: int = 10
    """Dispatches per WriteBatch while building (the node folds up to ``max_records``)."""
    tail: int = 20
    """Dispatches folded after the restore (the log's tail)."""
    payload_bytes: int = 200


def _slices(members: list[str]) -> list[MemberSliceRecord]:
    cuts = [members[i : i + _CHUNK] for i in range(0, len(members), _CHUNK)]
    return [
        MemberSliceRecord(
            tenant_id=_TENANT,
            group_id=_GROUP,
            membership_version=1,
            mailbox_shard=_SHARD,
            chunk_index=index,
            chunk_count=len(cuts),
            slot_bitmap=bitmap_bytes(range(index * _CHUNK, index * _CHUNK + len(part))),
            user_ids=tuple(part),
            joined_at=(0,) * len(part),
            shard_member_count=len(members),
            member_count=len(members),
        )
        for index, part in enumerate(cuts)
    ]


def _dispatch(seq: int, sender: str, payload: bytes, committed_at: int) -> GroupDispatch:
    mid = (committed_at << 32 | seq).to_bytes(16, "big")
    return GroupDispatch(
        tenant_id=_TENANT,
        dispatch_id=dispatch_id(int.from_bytes(mid, "big"), _SHARD),
        message_id=mid,
        conversation_id=_GROUP,
        conversation_kind="group",
        conversation_seq=seq,
        last_activity_id=mid,
        sender_id=sender,
        membership_version=1,
        target_mailbox_shard=_SHARD,
        committed_at=committed_at,
        message_type=1,
        payload=payload,
    )


def _config(settings: Settings) -> MailboxConfig:
    return MailboxConfig.from_settings(settings, _SHARD)


def _fold(shard: OwnedShard, batch: list[tuple[int, ShardLogRecord]]) -> int:
    result = shard.materialize(batch)
    shard.write(result)
    return len(result.ops)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_checkpoint(params: CheckpointParams, workdir: Path | None = None) -> dict[str, Any]:
    """One measurement (blocking; seconds of work per million entries)."""
    settings = Settings.load()
    config = _config(settings)
    members = [f"m{i}" for i in range(params.members)]
    dispatches = max(1, params.entries // params.members)
    payload = b"x" * params.payload_bytes
    now_ms = int(time.time() * 1000)
    base = Path(tempfile.mkdtemp(prefix="qim-bench-ckpt-", dir=workdir))
    try:
        live_store = MailboxStore(base / "live")
        live = OwnedShard(_SHARD, live_store, config, 1)
        offset = 0
        head: list[tuple[int, ShardLogRecord]] = []
        for record in _slices(members):
            head.append((offset, record))
            offset += 1
        started = time.monotonic()
        seq = 0
        pending = head
        while seq < dispatches:
            seq += 1
            pending.append((offset, _dispatch(seq, members[seq % len(members)], payload, now_ms)))
            offset += 1
            if len(pending) >= params.batch or seq == dispatches:
                _fold(live, pending)
                pending = []
        build_s = time.monotonic() - started
        entries = dispatches * params.members
        store_bytes = _size(base / "live")

        started = time.monotonic()
        staged = create_checkpoint(live_store, base / "staged")
        shipped = ship_checkpoint(
            staged, base / "remote", shard=_SHARD, checkpoint_id=live.applied_seq, shard_epoch=1
        )
        checkpoint_s = time.monotonic() - started
        live.close()

        started = time.monotonic()
        restored_path = restore_checkpoint(shipped, base / "fresh" / f"shard-{_SHARD}")
        store = MailboxStore(restored_path)
        shard = OwnedShard(_SHARD, store, config, 1)
        page = list(store.scan(b"", b"", False))[:1]
        restore_s = time.monotonic() - started
        assert page, "the restored store is empty"

        started = time.monotonic()
        tail: list[tuple[int, ShardLogRecord]] = []
        for _ in range(params.tail):
            seq += 1
            tail.append((offset, _dispatch(seq, members[seq % len(members)], payload, now_ms)))
            offset += 1
            if len(tail) >= params.batch:
                _fold(shard, tail)
                tail = []
        if tail:
            _fold(shard, tail)
        tail_s = time.monotonic() - started
        shard.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    tail_entries = params.tail * params.members
    target_ms = settings.mailbox_takeover_rto_target
    return {
        "params": asdict(params),
        "row": {
            "entries": entries,
            "store_mib": round(store_bytes / 2**20, 1),
            "build_s": round(build_s, 2),
            "replay_rate": round(entries / build_s) if build_s else None,
            "checkpoint_s": round(checkpoint_s, 3),
            "checkpoint_mib": round(shipped.bytes / 2**20, 1),
            "restore_s": round(restore_s, 3),
            "tail_entries": tail_entries,
            "tail_s": round(tail_s, 3),
            "takeover_s": round(restore_s + tail_s, 3),
            "rto_target_s": target_ms / 1000,
            "within_target": (restore_s + tail_s) * 1000 <= target_ms,
        },
    }
