"""Session-list proofs' shared half: a history, its reference list, and the list as shown.

The reference is computed from the dispatched history alone (never from the projection):
order = last activity descending, preview = the latest message's payload, unread = messages
of others above the read watermark (capped at ``unread_precise_limit``, then inexact),
mentions = those of them that name the user. Own messages never count.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from qim.schemas import dispatch_id
from qim.schemas.frames.history import SessionEntry
from qim.schemas.records.dispatch import EventTemplate, GroupDispatch
from tests.integration.mailbox_support import _now, message_id, shard_of

LIMIT = 200
Shown = tuple[str, int, bytes, int, bool, int]


def history(
    tenant: str,
    me: str,
    senders: Sequence[str],
    count: int,
    *,
    conversations: int = 5,
    seed: int = 7,
    own_every: int = 7,
) -> list[GroupDispatch]:
    """``count`` one-to-one-shaped messages into ``conversations`` conversations of ``me``, each
    from a random sender (every ``own_every``-th from ``me``), 20 % mentioning ``me``; one
    dispatch each, at ``me``'s MailboxShard."""
    rng = random.Random(seed)
    convs = [f"c{i}" for i in range(conversations)]
    seqs = dict.fromkeys(convs, 0)
    shard = shard_of(tenant, me)
    out = []
    for n in range(1, count + 1):
        conv = rng.choice(convs)
        seqs[conv] += 1
        sender = me if n % own_every == 0 else rng.choice(list(senders))
        mid = message_id()
        out.append(
            GroupDispatch(
                tenant_id=tenant,
                dispatch_id=dispatch_id(int.from_bytes(mid, "big"), shard),
                message_id=mid,
                conversation_id=conv,
                conversation_kind="direct",
                conversation_seq=seqs[conv],
                last_activity_id=mid,
                sender_id=sender,
                origin_device_id="dev",
                participants=(me, sender if sender != me else senders[0]),
                target_mailbox_shard=shard,
                committed_at=_now,
                event_template=EventTemplate(
                    mention_targets=(me,) if rng.random() < 0.2 and sender != me else ()
                ),
                message_type=1,
                payload=f"m{n}:{conv}".encode(),
            )
        )
    return out


def reference(
    records: Sequence[GroupDispatch], me: str, read: Mapping[str, int] | None = None
) -> list[Shown]:
    read = read or {}
    rows: list[tuple[bytes, Shown]] = []
    for conv in sorted({d.conversation_id for d in records}):
        msgs = [d for d in records if d.conversation_id == conv]
        last = max(msgs, key=lambda d: d.conversation_seq)
        others = [d for d in msgs if d.sender_id != me and d.conversation_seq > read.get(conv, 0)]
        mentions = sum(1 for d in others if me in d.event_template.mention_targets)
        unread = len(others)
        rows.append(
            (
                last.last_activity_id,
                (
                    conv,
                    last.conversation_seq,
                    last.payload,
                    min(unread, LIMIT),
                    unread <= LIMIT,
                    mentions,
                ),
            )
        )
    rows.sort(key=lambda r: r[0], reverse=True)
    return [shown for _, shown in rows]


def shown(entries: Sequence[SessionEntry]) -> list[Shown]:
    return [
        (
            e.conversation_id,
            e.latest_conversation_seq,
            e.preview_or_placeholder,
            e.unread_count,
            e.unread_exact,
            e.mention_count,
        )
        for e in entries
    ]
