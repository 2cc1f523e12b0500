"""Conversation ids: a deterministic one-to-one id and the group id form.

The spec names ``conversation_id`` everywhere but never fixes its form (it is an opaque
tenant-scoped string, spec 7 Part 2). Ours:

* **direct** (one-to-one): ``"d:" + hex(blake3(hash_input(DOMAIN, tenant, lo, hi))[:16])`` where
  ``lo``/``hi`` are the two user ids ordered by their UTF-8 bytes (the same as code-point order).
  Both users, their SDKs and the server derive the same id with no lookup and no "create" step,
  so two users can never end up with two conversations; it is order-independent by construction
  and tenant-scoped (the same user ids in another tenant give another id). The id is a one-way
  hash on purpose: it is 34 bytes whatever the user ids (it rides on every mailbox entry, whose
  budget is about 110 bytes, spec 7.3), so the sender names the peer and the writer checks
  membership by recomputing the id (:func:`is_direct_participant`). A user may write to
  themselves ("note to self"): ``lo == hi``, one participant.
* **group**: the group's id, which has the form ``"g:" + name`` (CREATE_GROUP{group_id: "g:team"},
  the docs/protocol.md vector). A group's conversation id *is* its group id: GroupMembership keys
  groups by it, PULL_MEMBERS sends it as ``conversation_id`` and LEAVE_GROUP as ``group_id``, so
  one string names the group everywhere and no mapping can drift.

The prefix makes the kind a property of the id, so the writer never needs a lookup to tell a
direct conversation from a group. Like the other derivations (``qim.schemas.events``) the
direct-id input and hash are an immutable contract item once deployed (spec 27.2.4); this module
is a candidate to move to ``qim.schemas`` for the SDK.
"""

from __future__ import annotations

from typing import Final

from qim.schemas.hashing import blake3_digest, hash_input, validate_identifier
from qim.schemas.records.outbox import DIRECT, GROUP, ConversationKind

__all__ = [
    "DIRECT_DIGEST_SIZE",
    "DIRECT_ID_DOMAIN",
    "DIRECT_PREFIX",
    "GROUP_PREFIX",
    "MAX_CONVERSATION_ID_BYTES",
    "conversation_kind",
    "direct_conversation_id",
    "direct_participants",
    "group_conversation_id",
    "group_id_for",
    "is_direct_participant",
    "validate_conversation_id",
]

DIRECT_PREFIX: Final = "d:"
GROUP_PREFIX: Final = "g:"
DIRECT_ID_DOMAIN: Final = "qim.direct-conversation.v1"
DIRECT_DIGEST_SIZE: Final = 16
MAX_CONVERSATION_ID_BYTES: Final = 128
"""Ours: ids are keys of every store and ride on every entry; 128 UTF-8 bytes is ample."""

_HEX: Final = frozenset("0123456789abcdef")
_DIRECT_ID_LENGTH: Final = len(DIRECT_PREFIX) + 2 * DIRECT_DIGEST_SIZE


def direct_participants(user_a: str, user_b: str) -> tuple[str, ...]:
    """The participants in canonical order: UTF-8 byte order, one entry for a note to self."""
    validate_identifier(user_a, "user_id")
    validate_identifier(user_b, "user_id")
    lo, hi = sorted((user_a, user_b), key=lambda u: u.encode("utf-8"))
    return (lo,) if lo == hi else (lo, hi)


def direct_conversation_id(tenant_id: str, user_a: str, user_b: str) -> str:
    """The one-to-one conversation of two users of one tenant (order-independent)."""
    validate_identifier(tenant_id, "tenant_id")
    validate_identifier(user_a, "user_id")
    validate_identifier(user_b, "user_id")
    lo, hi = sorted((user_a, user_b), key=lambda u: u.encode("utf-8"))
    digest = blake3_digest(hash_input(DIRECT_ID_DOMAIN, tenant_id, lo, hi))
    return DIRECT_PREFIX + digest[:DIRECT_DIGEST_SIZE].hex()


def is_direct_participant(
    tenant_id: str, conversation_id: str, user_id: str, peer_user_id: str
) -> bool:
    """True iff ``conversation_id`` is the direct conversation of ``user_id`` and the peer.

    A malformed peer or an id of another tenant is simply not a match (no exception): the
    writer answers PERMISSION_DENIED either way, indistinguishable from a stranger.
    """
    if conversation_kind(conversation_id) != DIRECT:
        return False
    try:
        return direct_conversation_id(tenant_id, user_id, peer_user_id) == conversation_id
    except (TypeError, ValueError):
        return False


def group_id_for(name: str) -> str:
    """A new group's id from a name: ``"g:" + name`` (validated)."""
    validate_identifier(name, "group name")
    return group_conversation_id(GROUP_PREFIX + name)


def group_conversation_id(group_id: str) -> str:
    """The conversation id of a group: its group id, checked to be a well-formed ``g:`` id."""
    if conversation_kind(group_id) != GROUP:
        raise ValueError(f"not a group id ('g:' + name): {group_id!r}")
    return group_id


def conversation_kind(conversation_id: str) -> ConversationKind | None:
    """``"direct"``, ``"group"`` or None when the id is not well-formed (never raises)."""
    if not isinstance(conversation_id, str) or "\x00" in conversation_id:
        return None
    try:
        size = len(conversation_id.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    if size > MAX_CONVERSATION_ID_BYTES:
        return None
    if conversation_id.startswith(DIRECT_PREFIX):
        digest = conversation_id[len(DIRECT_PREFIX) :]
        ok = len(conversation_id) == _DIRECT_ID_LENGTH and set(digest) <= _HEX
        return DIRECT if ok else None
    if conversation_id.startswith(GROUP_PREFIX) and len(conversation_id) > len(GROUP_PREFIX):
        return GROUP
    return None


def validate_conversation_id(conversation_id: str) -> ConversationKind:
    """The kind of a well-formed id; ``ValueError`` (naming the rule) otherwise."""
    kind = conversation_kind(conversation_id)
    if kind is None:
        raise ValueError(
            f"malformed conversation_id {conversation_id!r}: expected 'd:' + 32 lowercase hex "
            f"or 'g:' + group id, at most {MAX_CONVERSATION_ID_BYTES} UTF-8 bytes, no NUL"
        )
    return kind
