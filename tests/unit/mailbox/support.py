"""Builders for dispatch logs: direct, group and amend dispatches, chunked slices, users by
shard."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache

import msgspec

from qim.core.mailbox import MailboxConfig, MemoryMailboxStore, commit, materialize
from qim.core.mailbox.result import MaterializeResult
from qim.core.membership import bitmap_bytes
from qim.schemas import compose_mailbox_seq, dispatch_id, lane_id
from qim.schemas.events import EventType
from qim.schemas.frames.base import EntryFlags
from qim.schemas.records.dispatch import DispatchLogRecord, EventTemplate, GroupDispatch
from qim.schemas.records.membership import MemberSliceRecord
from qim.schemas.records.outbox import PreviewPlaceholder

T = "t1"
SHARD = 0
EPOCH = 1
BASE_TIME = 1_700_000_000_000
CONFIG = MailboxConfig(mailbox_shard=SHARD, mailbox_shard_count=4)

Log = list[tuple[int, DispatchLogRecord]]


def seq(offset: int, epoch: int = EPOCH) -> int:
    return compose_mailbox_seq(epoch, offset)


@cache
def local_users(count: int, prefix: str = "u") -> tuple[str, ...]:
    """The first ``count`` ids ``prefix0, prefix1, ...`` whose mailbox is on the test shard."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        user = f"{prefix}{i}"
        if CONFIG.in_this_shard(T, user):
            found.append(user)
        i += 1
    return tuple(found)


def remote_user() -> str:
    return next(u for u in (f"r{i}" for i in range(1000)) if not CONFIG.in_this_shard(T, u))


def users_on_other_lanes(lane: int, count: int, prefix: str = "m") -> Iterator[str]:
    """Ids whose lane differs from ``lane`` (shard does not matter for group slices)."""
    i = 0
    made = 0
    while made < count:
        user = f"{prefix}{i}"
        i += 1
        if lane_id(T, user, CONFIG.lane_count) != lane:
            made += 1
            yield user


def message_id(n: int) -> bytes:
    return ((0x1000 + n) << 80 | n << 24).to_bytes(16, "big")


def dispatch(
    n: int,
    *,
    conversation: str = "d:a:b",
    kind: str = "direct",
    sender: str = "u0",
    participants: Sequence[str] = (),
    seq_in_conversation: int | None = None,
    version: int = 0,
    fencing_epoch: int = 0,
    committed_at: int | None = None,
    template: EventTemplate | None = None,
    client_message_id: str = "",
    inline_body: bool = False,
    payload: bytes = b"body",
    event_type: int = 0,
    shard: int = SHARD,
    retention_class: str = "default",
) -> GroupDispatch:
    """Message ``n`` as a dispatch to ``shard`` (ids derived from ``n``; time = BASE + n s)."""
    mid = message_id(n)
    return GroupDispatch(
        tenant_id=T,
        dispatch_id=dispatch_id(int.from_bytes(mid, "big"), shard),
        message_id=mid,
        conversation_id=conversation,
        conversation_kind=kind,  # type: ignore[arg-type]
        conversation_seq=n if seq_in_conversation is None else seq_in_conversation,
        last_activity_id=mid,
        sender_id=sender,
        origin_device_id="dev1",
        client_message_id=client_message_id,
        participants=tuple(participants),
        fencing_epoch=fencing_epoch,
        membership_version=version,
        target_mailbox_shard=shard,
        committed_at=BASE_TIME + n * 1000 if committed_at is None else committed_at,
        event_template=template or EventTemplate(),
        event_type=event_type,
        inline_body=inline_body,
        payload=payload,
        retention_class=retention_class,  # type: ignore[arg-type]
    )


AMEND_TEMPLATE = EventTemplate(counts_unread=False, affects_session_order=False)
PLACEHOLDER = msgspec.msgpack.encode(PreviewPlaceholder(state="recalled"))


def amend(
    n: int,
    target: GroupDispatch,
    action: str = "recall",
    *,
    new_payload: bytes = b"",
    actor: str | None = None,
    committed_at: int | None = None,
    seq_in_conversation: int | None = None,
) -> GroupDispatch:
    """The amend CONTROL event ``n`` (its own seq ``n``) on ``target``, as the writer builds it
    (GroupDispatch docstring: CONTROL, AMEND_TEMPLATE, ``target_*`` copied from the target)."""
    base = dispatch(
        n,
        conversation=target.conversation_id,
        kind=target.conversation_kind,
        sender=actor or target.sender_id,
        participants=target.participants,
        version=target.membership_version,
        template=AMEND_TEMPLATE,
        payload=new_payload,
        event_type=int(EventType.CONTROL),
        committed_at=committed_at,
        seq_in_conversation=seq_in_conversation,
        fencing_epoch=target.fencing_epoch,
    )
    t = target.event_template
    flags = int(EntryFlags.AFFECTS_SESSION_ORDER | EntryFlags.TIMELINE_VISIBLE)
    return msgspec.structs.replace(
        base,
        amend_action=action,
        target_message_id=target.message_id,
        target_conversation_seq=target.conversation_seq,
        target_sender_id=target.sender_id,
        target_flags=flags | (int(EntryFlags.COUNTS_UNREAD) if t.counts_unread else 0),
        target_mention_targets=t.mention_targets,
        target_reply_to_sender_id=t.reply_to_sender_id,
        preview_or_placeholder=new_payload if action == "edit" else PLACEHOLDER,
    )


def group_slice(
    group: str,
    version: int,
    members: Sequence[tuple[str, int]],
    *,
    chunk: int = 4096,
    shard: int = SHARD,
) -> list[MemberSliceRecord]:
    """The slice chunks of ``members`` ((user, joined_at), slots 0..n-1) for ``shard``."""
    cuts = [members[i : i + chunk] for i in range(0, len(members), chunk)] or [[]]
    out = []
    for index, part in enumerate(cuts):
        first = index * chunk
        out.append(
            MemberSliceRecord(
                tenant_id=T,
                group_id=group,
                membership_version=version,
                mailbox_shard=shard,
                chunk_index=index,
                chunk_count=len(cuts),
                slot_bitmap=bitmap_bytes(range(first, first + len(part))),
                user_ids=tuple(u for u, _ in part),
                joined_at=tuple(j for _, j in part),
                shard_member_count=len(members),
                member_count=len(members),
            )
        )
    return out


def run(
    store: MemoryMailboxStore,
    log: Log,
    config: MailboxConfig = CONFIG,
    epoch: int = EPOCH,
) -> MaterializeResult:
    """Materialize ``log`` as one batch and commit it."""
    result = materialize(store, log, shard_epoch=epoch, config=config)
    commit(store, result)
    return result


def numbered(records: Sequence[DispatchLogRecord], start: int = 0) -> Log:
    return [(start + i, r) for i, r in enumerate(records)]
