"""``max_conversations_per_user`` on the MailboxNode's side: count, detect a crossing, plan it.

The count is the session list's own: the user's rows that :func:`listed` keeps (not locally
deleted past their latest, and still a member; ``include_left=False``), the same rows
``load_snapshot`` caps at ``max_conversations_per_user`` (12.8.1). A fold knows only the rows it
touched, so it reports ``listed_delta`` (``SessionChange``); the shell counts the committed store
once for a user whose delta is not zero and derives the count before the fold from it.

Only a crossing of the cap is published (:func:`quota_crossing`): ``exhausted`` means
``conversations >= cap`` (``admit_conversation``: the cap-th conversation is the last one let
in). The record's latest value per user is the state (``qim.user-quota`` is compacted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from qim.core.mailbox.ports import KVReader
from qim.core.mailbox.session_store import decode_state, row_prefix, state_key
from qim.core.mailbox.sessions import SessionChange
from qim.core.session_list import UserConversationState, admit_conversation
from qim.core.session_list.rows import SessionRow, listed
from qim.schemas.records.user_quota import UserQuota

__all__ = ["listed_count", "plan_quota_records", "quota_crossing"]

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
