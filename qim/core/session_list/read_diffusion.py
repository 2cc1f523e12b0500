"""What the session list shows for a ``mention_only`` conversation (spec 10.2.3, I-33, AT-40).

A silent member has no mailbox entry for the silent-period messages, so its projection row
stops where its entries stopped. The MailboxShard keeps one :class:`TierHead` per conversation
(written once per shard per message, never per member: the 10.2.3 "batched per shard"
``delivered_conversation_seq``), and the read path joins it onto the user's row
(:func:`overlay`): ``latest_conversation_seq`` / ``last_activity_id`` / ``last_message_id``
from the head, ``unread_count ~= latest - max(read, joined_at, hidden_before)`` with
``unread_exact = false``, ``write_policy = mention_only`` and ``delivered_conversation_seq``
so the client can locate its gap (10.2.3 hard rules 1-2). ``always`` conversations are left
exactly as the projection has them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from qim.core.session_list.rows import SessionRow, UserProjection
from qim.core.session_list.state import UserConversationState
from qim.schemas.frames.base import U128, U128_ZERO, u128_from_bytes
from qim.schemas.frames.history import SessionEntry

__all__ = ["MENTION_ONLY", "TierHead", "mark_entries", "overlay", "overlay_row"]

MENTION_ONLY: Final = "mention_only"


class TierHead(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The shard's view of a read-diffusion conversation's head, from its dispatches."""

    write_policy: str = "always"
    latest_conversation_seq: int = 0
    last_activity_id: U128 = U128_ZERO
    last_message_id: U128 = U128_ZERO
    switched_at_conversation_seq: int = 0
    """The first message under the current policy: the switch instant in seq terms."""

    @property
    def read_diffusion(self) -> bool:
        return self.write_policy == MENTION_ONLY


def overlay_row(row: SessionRow | None, state: UserConversationState, head: TierHead) -> SessionRow:
    """The row a member of a ``mention_only`` conversation is shown (module docstring)."""
    base = row or SessionRow(conversation_id=state.conversation_id)
    latest = max(base.latest_conversation_seq, head.latest_conversation_seq)
    last_message_id = base.last_message_id
    if head.latest_conversation_seq >= base.latest_conversation_seq and head.last_message_id:
        last_message_id = u128_from_bytes(head.last_message_id)
    left = state.left_at_conversation_seq
    upper = latest if left is None else min(latest, left - 1)
    lower = max(
        state.read_conversation_seq,
        state.joined_at_conversation_seq,
        state.hidden_before_conversation_seq,
    )
    return msgspec.structs.replace(
        base,
        latest_conversation_seq=latest,
        last_activity_id=max(base.last_activity_id, u128_from_bytes(head.last_activity_id)),
        last_message_id=last_message_id,
        unread_count=max(0, upper - lower),
        unread_exact=False,
    )


def overlay(projection: UserProjection, heads: Mapping[str, TierHead]) -> UserProjection:
    """``projection`` with every read-diffusion conversation the user is a member of joined
    with its shard head; other rows unchanged."""
    rows = dict(projection.rows)
    for conv, head in heads.items():
        state = projection.state(conv)
        if not head.read_diffusion or not state.active or conv not in projection.states:
            continue
        rows[conv] = overlay_row(rows.get(conv), state, head)
    return msgspec.structs.replace(projection, rows=rows)


def mark_entries(
    sessions: Iterable[SessionEntry], heads: Mapping[str, TierHead]
) -> tuple[SessionEntry, ...]:
    """``sessions[]`` with ``write_policy`` and, for ``mention_only``,
    ``delivered_conversation_seq`` (10.2.3 hard rule 1: never one without the other)."""
    out = []
    for entry in sessions:
        head = heads.get(entry.conversation_id)
        if head is not None and head.read_diffusion:
            entry = msgspec.structs.replace(
                entry,
                write_policy=MENTION_ONLY,
                delivered_conversation_seq=head.latest_conversation_seq,
            )
        out.append(entry)
    return tuple(out)
