"""``max_conversations_per_user`` on the MailboxNode's side: count, detect a crossing, plan it.

The count is the session list's own: the user's rows that :func:`listed` keeps (not locally
deleted past their latest, and still a member; ``include_left=False``), the same rows
``load_snapshot`` caps at ``max_conversations_per_user`` (12.8.1). A fold knows only the rows it
touched, so it reports ``listed_delta`` (``SessionChange``); the shell counts the committed store
once for a user whose delta is not zero and derives the count before the fold from it.

Only a crossing of the cap is published (:func:`quota_crossing`): ``exhausted`` means
``conversations >= cap`` (``admit_conversation``: the cap-th conversation is the last one let
in). The record's latest value per user is the state (``qim.user-quota`` is compacted).

A crossing whose record was lost (the node died after the WriteBatch, before the ack; the
re-fold of an applied input has no delta) is healed at the next takeover of the shard: the new
owner reads its partition to the end (:func:`latest_published`), counts the users it names and
every user at or above the cap (:func:`shard_counts`), and publishes what :func:`reconcile`
finds wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import ROW, decode_state, row_prefix, state_key
from qim.core.mailbox.sessions import SessionChange
from qim.core.session_list import UserConversationState, admit_conversation
from qim.core.session_list.rows import SessionRow, listed
from qim.schemas.records.user_quota import UserQuota, decode_user_quota

__all__ = [
    "latest_published",
    "listed_count",
    "plan_quota_records",
    "quota_crossing",
    "reconcile",
    "shard_counts",
]

UserKey = tuple[str, str]
"""``(tenant_id, user_id)``."""

_ROW: Final = msgspec.json.Decoder(SessionRow)


def quota_crossing(before: int, after: int, limit: int) -> bool | None:
    """The new ``exhausted`` value if ``before -> after`` crosses ``limit``, else None."""
    was = admit_conversation(before, limit) is not None
    now = admit_conversation(after, limit) is not None
    return None if was == now else now


def listed_count(kv: KVReader, tenant_id: str, user_id: str) -> int:
    """How many of the user's rows the session list shows (one scan of ``K``, one get each)."""
    prefix = row_prefix(tenant_id, user_id)
    count = 0
    for _, value in kv.scan(prefix, prefix, False):
        row = _ROW.decode(value)
        raw = kv.get(state_key(tenant_id, user_id, row.conversation_id))
        state = (
            UserConversationState(conversation_id=row.conversation_id)
            if raw is None
            else decode_state(raw)
        )
        count += listed(row, state)
    return count


def plan_quota_records(
    kv: KVReader,
    changes: Sequence[SessionChange],
    *,
    limit: int,
    mailbox_shard: int,
    as_of_mailbox_seq: int,
) -> list[UserQuota]:
    """One record per user whose committed fold crossed ``limit`` (``kv`` after the write)."""
    out = []
    for change in changes:
        if not change.listed_delta:
            continue
        after = listed_count(kv, change.tenant_id, change.user_id)
        crossed = quota_crossing(after - change.listed_delta, after, limit)
        if crossed is None:
            continue
        out.append(
            UserQuota(
                tenant_id=change.tenant_id,
                user_id=change.user_id,
                conversations=after,
                exhausted=crossed,
                as_of_mailbox_seq=as_of_mailbox_seq,
                mailbox_shard=mailbox_shard,
            )
        )
    return out


def latest_published(values: Iterable[bytes | None]) -> dict[UserKey, UserQuota]:
    """The latest record per user of a partition read in offset order (as the writer's
    follower folds it: tombstones and undecodable values are skipped)."""
    out: dict[UserKey, UserQuota] = {}
    for value in values:
        if value is None:
            continue
        try:
            quota = decode_user_quota(value)
        except (msgspec.DecodeError, ValueError):
            continue
        out[(quota.tenant_id, quota.user_id)] = quota
    return out


def shard_counts(kv: KVReader, limit: int, users: Iterable[UserKey] = ()) -> dict[UserKey, int]:
    """The listed count of each of ``users`` and of every user of the shard at or above
    ``limit``. One pass over ``K`` (a user's rows are contiguous) counts rows without reading
    anything else; only a user with at least ``limit`` rows is counted exactly
    (:func:`listed_count`: a row not listed is never more than a row)."""
    out = {user: listed_count(kv, *user) for user in sorted(set(users))}
    current: UserKey | None = None
    rows = 0
    for key, _ in kv.scan(ROW, ROW, False):
        tenant, user, _conv = key[len(ROW) :].split(b"\x00", 2)
        owner = (tenant.decode(), user.decode())
        if owner != current:
            _count_if_full(kv, current, rows, limit, out)
            current, rows = owner, 0
        rows += 1
    _count_if_full(kv, current, rows, limit, out)
    return out


def _count_if_full(
    kv: KVReader, user: UserKey | None, rows: int, limit: int, out: dict[UserKey, int]
) -> None:
    if user is None or rows < limit or user in out:
        return
    count = listed_count(kv, *user)
    if count >= limit:
        out[user] = count


def reconcile(
    published: Mapping[UserKey, UserQuota],
    counts: Mapping[UserKey, int],
    cap: int,
    *,
    mailbox_shard: int = 0,
    as_of_mailbox_seq: int = 0,
) -> list[UserQuota]:
    """The records that make ``qim.user-quota`` tell the truth, sorted by user.

    ``counts``: the committed listed count of every user in ``published`` (a missing one
    counts 0) and of every user at or above ``cap``. A user is corrected when the latest
    record's ``exhausted`` differs from the count's, or when it has no record and is
    exhausted; a user under the cap with no record needs none (the writer's default)."""
    out = []
    for user in sorted(published.keys() | counts.keys()):
        count = counts.get(user, 0)
        exhausted = admit_conversation(count, cap) is not None
        record = published.get(user)
        if (record.exhausted if record is not None else False) == exhausted:
            continue
        out.append(
            UserQuota(
                tenant_id=user[0],
                user_id=user[1],
                conversations=count,
                exhausted=exhausted,
                as_of_mailbox_seq=as_of_mailbox_seq,
                mailbox_shard=mailbox_shard,
            )
        )
    return out
