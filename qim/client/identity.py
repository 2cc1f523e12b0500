"""Who the client is (tenant, user), for deriving one-to-one conversation ids locally.

A one-to-one conversation has no "create" step: its id is a deterministic, order-independent
hash of the tenant and the two user ids (:func:`direct_conversation_id`, re-exported from
``qim.core.conversation.ids`` so the SDK and the ConversationWriter can never disagree). To
derive it the client must know its own tenant and user, which AUTH_OK does not carry (A.4 #1).
Two sources, in this order:

1. what the application says (``QimClient.identity = Identity(...)`` or the ``tenant_id`` /
   ``user_id`` arguments of ``send_direct``): right for any token format;
2. the claims inside a qim access token (``qat1.<kid>.<payload>.<sig>``, payload = base64url
   JSON with ``tenant_id`` and ``user_id``; see ``qim.auth.tokens``). The client reads them
   *without* verifying the signature - it has no key and needs none: the server verifies the
   token and takes the identity of every request from the session, never from the client
   (§20.1), so a wrong local value only derives an id the writer refuses (PERMISSION_DENIED).

A token in another format yields no identity; ``send_direct`` then asks for it explicitly.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from qim.core.conversation.ids import direct_conversation_id

__all__ = ["Identity", "direct_conversation_id", "identity_from_token"]

_ACCESS_TOKEN_TYPE: Final = "qat1"
_MAX_TOKEN_CHARS: Final = 4096


@dataclass(frozen=True, slots=True)
class Identity:
    """The authenticated user as the client knows it."""

    tenant_id: str
    user_id: str

    def direct_conversation_id(self, peer_user_id: str) -> str:
        """The one-to-one conversation of this user and ``peer_user_id`` in this tenant."""
        return direct_conversation_id(self.tenant_id, self.user_id, peer_user_id)


def identity_from_token(access_token: str) -> Identity | None:
    """The (unverified) tenant and user of a qim access token; None for any other token."""
    if len(access_token) > _MAX_TOKEN_CHARS:
        return None
    parts = access_token.split(".")
    if len(parts) != 4 or parts[0] != _ACCESS_TOKEN_TYPE:
        return None
    payload = parts[2]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError):  # JSONDecodeError and UnicodeDecodeError included
        return None
    if not isinstance(claims, dict):
        return None
    tenant, user = claims.get("tenant_id"), claims.get("user_id")
    if not isinstance(tenant, str) or not isinstance(user, str) or not tenant or not user:
        return None
    return Identity(tenant, user)
