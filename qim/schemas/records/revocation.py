"""``qim.revocations``: one record per committed revocation, read by every gateway (15.3.2).

Why a topic of its own, not the presence topic: presence is compacted by device, and a
revocation is an event every gateway must see once, in order, whatever it holds. The AuthService
writes the Redis record first (the next login is refused from then on) and publishes this second,
so a live connection is kicked within one consumer round on every gateway.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["RevocationNotice", "decode_revocation", "encode_revocation"]


class RevocationNotice(msgspec.Struct, frozen=True, kw_only=True):
    """A token, a device or every device of a user, revoked at ``revoked_at`` (Unix ms)."""

    scope: Literal["token", "device", "user"]
    reason: str
    revoked_at: int
    tenant_id: str | None = None
    user_id: str | None = None
    device_id: str | None = None
    token_id: str | None = None


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(RevocationNotice)


def encode_revocation(notice: RevocationNotice) -> bytes:
    return _ENCODER.encode(notice)


def decode_revocation(raw: bytes) -> RevocationNotice:
    """Raises ``msgspec.DecodeError`` / ``ValidationError`` for a malformed record."""
    return _DECODER.decode(raw)
