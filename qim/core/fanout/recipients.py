"""Who receives a dispatch: the MailboxNode's expansion rule, written once as a pure function.

The FanoutCoordinator decides which shards get a dispatch; the MailboxNode of each shard decides
which of its users get entries (spec 10.1 steps 7-9). The two halves only make sense together,
so the expansion is stated here, next to the producer, as the contract the MailboxNode
implements and the reference the tests and the audit compare against:

1. explicit recipients: the dispatch's ``participants`` routed to this shard -- a direct
   conversation's users, or a membership CONTROL message's subjects. They get the dispatch's
   ``event_type`` (MESSAGE, or MEMBERSHIP for a subject) whatever their visible interval: a
   leaver's own removal is outside its interval by design (``left_at`` = that seq, 7.5, A.3).
2. member expansion, only for a group dispatch that pins a version (``membership_version`` >
   0): every user of that version's slice on this shard inside its interval
   ``(joined_at, left_at)`` at ``conversation_seq`` (the 10.1 step 9 filter), minus the
   explicit recipients, gets a MESSAGE entry. The pinned slice gives ``joined_at``; ``left_at``
   comes from ``departures`` (what later slices said about that same interval): when the writer
   pins the current version no member of it has left yet, but a dispatch pinned to an older
   version (recovery, a re-append) must not reach a member who left before its seq.
3. mentions (11.4.1): ``mention_type`` on the primary entry -- AT_ME for a named user, else
   AT_ALL for ``"@all"``, else REPLY_ME for ``reply_to_sender_id``. Only with
   ``mention_entries`` (the ``mention_only`` tier) does a mentioned user also get a MENTION entry.
4. the ``mention_only`` tier (10.2.3, 11.4.1): a slice member outside the shard's active set
   gets no primary entry; every mentioned member (active or silent) gets a MENTION entry.
5. chunks: a dispatch with ``chunk_count > 1`` writes only the entries of its own kind -- the
   MENTION chunk the MENTION entries, the others the primary entries (``event_group``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from qim.core.fanout.write_policy import MENTION_ONLY
from qim.core.membership import Departures, ShardSlice
from qim.schemas.events import EventType
from qim.schemas.frames.base import MENTION_ALL, MentionType
from qim.schemas.records.dispatch import GroupDispatch
from qim.schemas.records.outbox import GROUP

__all__ = ["Delivery", "SliceMismatch", "expand_dispatch", "mention_type_of"]


class SliceMismatch(ValueError):
    """The slice handed in is not the one the dispatch pins (or is missing): a bug of ours."""


@dataclass(frozen=True, slots=True, order=True)
class Delivery:
    """One entry a dispatch writes: for ``user_id``, of ``event_type``, with ``mention_type``."""

    user_id: str
    event_type: int
    mention_type: int = MentionType.NONE


def mention_type_of(dispatch: GroupDispatch, user_id: str) -> int:
    """The ``mention_type`` of ``user_id``'s primary entry (11.4.1 precedence, module doc)."""
    template = dispatch.event_template
    if user_id in template.mention_targets:
        return MentionType.AT_ME
    if MENTION_ALL in template.mention_targets:
        return MentionType.AT_ALL
    if template.reply_to_sender_id and template.reply_to_sender_id == user_id:
        return MentionType.REPLY_ME
    return MentionType.NONE


def _primaries(
    dispatch: GroupDispatch,
    shard_slice: ShardSlice | None,
    shard_of: Callable[[str], int],
    departures: Departures,
) -> dict[str, int]:
    shard = dispatch.target_mailbox_shard
    explicit = {u: dispatch.event_type for u in dispatch.participants if shard_of(u) == shard}
    if dispatch.conversation_kind != GROUP or dispatch.membership_version == 0:
        return explicit
    if shard_slice is None or (
        shard_slice.tenant_id,
        shard_slice.group_id,
        shard_slice.membership_version,
        shard_slice.mailbox_shard,
    ) != (dispatch.tenant_id, dispatch.conversation_id, dispatch.membership_version, shard):
        raise SliceMismatch(f"dispatch pins version {dispatch.membership_version} on {shard}")
    seq = dispatch.conversation_seq
    members = {
        user: int(EventType.MESSAGE)
        for user, joined_at in zip(shard_slice.user_ids, shard_slice.joined_at, strict=True)
        if joined_at < seq and seq < departures.get((user, joined_at), seq + 1)
    }
    return members | explicit


def expand_dispatch(
    dispatch: GroupDispatch,
    shard_slice: ShardSlice | None,
    shard_of: Callable[[str], int],
    *,
    mention_entries: bool = False,
    departures: Departures | None = None,
    is_active: Callable[[str], bool] | None = None,
) -> tuple[Delivery, ...]:
    """Every entry ``dispatch`` writes on its shard, sorted by (user, event_type).

    ``shard_slice`` is the pinned version's slice on this shard (None when the dispatch pins
    none); ``shard_of`` routes a user id of the dispatch's tenant to its MailboxShard;
    ``departures`` the closed intervals known for the group on this shard (none by default).
    ``is_active``: the shard's active set (10.2.3), read only for a ``mention_only`` dispatch:
    a slice member outside it gets no primary entry, only a MENTION entry when mentioned (the
    sender and explicit recipients always get theirs). None = everyone active.
    """
    out: list[Delivery] = []
    only = EventType(dispatch.event_type) if dispatch.chunk_count > 1 else None
    primaries = _primaries(dispatch, shard_slice, shard_of, departures or {})
    read_diffusion = dispatch.write_policy == MENTION_ONLY and dispatch.membership_version > 0
    mention_entries = mention_entries or read_diffusion
    explicit = frozenset(dispatch.participants)
    for user, event_type in sorted(primaries.items()):
        mention = mention_type_of(dispatch, user)
        silent = (
            read_diffusion
            and is_active is not None
            and user != dispatch.sender_id
            and user not in explicit
            and not is_active(user)
        )
        if (only is None or only != EventType.MENTION) and not silent:
            out.append(Delivery(user, event_type, mention))
        if mention_entries and mention != MentionType.NONE and only in (None, EventType.MENTION):
            out.append(Delivery(user, EventType.MENTION, mention))
    return tuple(sorted(out))
