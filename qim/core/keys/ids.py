"""Key identities of spec 21.3.1 / 7.1: ``dek_id = (key_scope, key_id, key_version)``."""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["DekId", "KeyScope", "conversation_key_id", "user_key_id"]


class KeyScope(enum.IntEnum):
    """Which level of the hierarchy a key sits at (the ``key_scope`` of ``dek_id``)."""

    TENANT = 1
    CONVERSATION = 2
    USER = 3
    EPHEMERAL = 4


class DekId(NamedTuple):
    """``(key_scope, key_id, key_version)``. ``key_id`` names the subject inside its tenant
    (the conversation or user id; the tenant id for a TMK); ``key_version`` is the rotation
    version, or the ``date_bucket`` (days since the epoch) for an EphemeralDEK (21.1)."""

    key_scope: KeyScope
    key_id: str
    key_version: int


def conversation_key_id(conversation_id: str) -> str:
    """The ``key_id`` of a ConversationDEK (and of its EphemeralDEKs)."""
    return conversation_id


def user_key_id(user_id: str) -> str:
    """The ``key_id`` of a UserDEK."""
    return user_id
