"""The ``MailboxCursor`` token (spec 6.8, 20.2.1): the signed, unforgeable half of a device cursor.

Why split the cursor in two: ``last_applied_mailbox_seq`` moves with every MAILBOX_BATCH the
client applies, so it travels in clear next to the token and the server only checks it against
``W[lane]`` (6.8). Everything a client must not choose - which shard and lane it reads, in which
``shard_epoch``, as which user and device - is fixed in the token and covered by an HMAC, so the
server keeps no per-device issue records and the client advances locally without re-issue.

Wire layout (all integers big-endian, strings UTF-8, lengths count octets)::

    u8      version            = 1
    u8      kid length k       1..32
    k       kid                [A-Za-z0-9_-], names the key in the CursorKeyRing
    u16+n   tenant_id          length-prefixed
    u16+n   user_id            length-prefixed
    u16+n   device_id          length-prefixed
    u32     mailbox_shard_id
    u8      lane_id
    u16     shard_epoch        <= 0x7FFF (6.5: bit 63 of mailbox_seq stays 0)
    u64     issued_at          Unix ms; signed so a re-issue is distinguishable, never an expiry
    32      tag                HMAC-SHA256(subkey, every octet before the tag)
                               subkey = HMAC-SHA256(secret, "qim-mailbox-cursor/v1")

The per-purpose subkey means a secret shared with another signer (AuthService tokens) can never
produce a valid cursor. Verification order: shape -> kid -> MAC (constant time) -> claims, so a
forged token is never parsed beyond its header. A token signed by a key that left the ring is
rejected: rotation (put a new key first, keep the old one while its cursors matter) is the only
way a cursor token "expires" (20.2.1: no fixed TTL, it dies with its shard_epoch).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from qim.schemas.seqs import MAX_EPOCH

__all__ = [
    "CURSOR_TOKEN_VERSION",
    "CursorClaims",
    "CursorKey",
    "CursorKeyRing",
    "CursorTokenError",
    "sign_cursor",
    "verify_cursor",
]

CURSOR_TOKEN_VERSION: Final = 1
_TAG_SIZE: Final = 32
_SUBKEY_LABEL: Final = b"qim-mailbox-cursor/v1"
_KID: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
_MIN_SECRET: Final = 16
_TAIL: Final = struct.Struct(">IBHQ")  # mailbox_shard_id, lane_id, shard_epoch, issued_at
_U16: Final = struct.Struct(">H")


class CursorTokenError(ValueError):
    """The token is not one we signed for these claims; the caller answers CURSOR_INVALID."""


@dataclass(frozen=True, slots=True)
class CursorKey:
    """One HMAC key of the ring; ``secret`` never appears in repr or logs."""

    kid: str
    secret: bytes

    def __post_init__(self) -> None:
        if not _KID.fullmatch(self.kid):
            raise ValueError(f"kid must match {_KID.pattern}, got {self.kid!r}")
        if len(self.secret) < _MIN_SECRET:
            raise ValueError(f"cursor secret must be >= {_MIN_SECRET} octets")

    def __repr__(self) -> str:
        return f"CursorKey(kid={self.kid!r})"

    def subkey(self) -> bytes:
        return hmac.new(self.secret, _SUBKEY_LABEL, hashlib.sha256).digest()


class CursorKeyRing:
    """Keys by kid; the first signs, every key verifies (rotation without a flag day)."""

    __slots__ = ("_active", "_subkeys")

    def __init__(self, keys: Iterable[CursorKey]) -> None:
        ordered = list(keys)
        if not ordered:
            raise ValueError("a cursor key ring needs at least one key")
        self._subkeys: dict[str, bytes] = {}
        for key in ordered:
            if key.kid in self._subkeys:
                raise ValueError(f"duplicate kid {key.kid!r}")
            self._subkeys[key.kid] = key.subkey()
        self._active = ordered[0].kid

    @property
    def active_kid(self) -> str:
        return self._active

    def __contains__(self, kid: object) -> bool:
        return kid in self._subkeys

    def __iter__(self) -> Iterator[str]:
        return iter(self._subkeys)

    def subkey(self, kid: str) -> bytes | None:
        return self._subkeys.get(kid)


@dataclass(frozen=True, slots=True)
class CursorClaims:
    """The signed fields of 6.8; ``last_applied_mailbox_seq`` is deliberately not one of them."""

    tenant_id: str
    user_id: str
    device_id: str
    mailbox_shard_id: int
    lane_id: int
    shard_epoch: int
    issued_at: int


def _text(value: str, name: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"{name} longer than 65535 octets")
    return _U16.pack(len(raw)) + raw


def _claims_bytes(claims: CursorClaims) -> bytes:
    if not 0 <= claims.shard_epoch <= MAX_EPOCH:
        raise ValueError(f"shard_epoch must be in [0, {MAX_EPOCH:#x}]")
    return b"".join(
        (
            _text(claims.tenant_id, "tenant_id"),
            _text(claims.user_id, "user_id"),
            _text(claims.device_id, "device_id"),
            _TAIL.pack(
                claims.mailbox_shard_id, claims.lane_id, claims.shard_epoch, claims.issued_at
            ),
        )
    )


def sign_cursor(claims: CursorClaims, ring: CursorKeyRing) -> bytes:
    """The token for ``claims``, signed with the ring's active key."""
    kid = ring.active_kid.encode("ascii")
    body = bytes((CURSOR_TOKEN_VERSION, len(kid))) + kid + _claims_bytes(claims)
    subkey = ring.subkey(ring.active_kid)
    assert subkey is not None  # the active kid is always in the ring
    return body + hmac.new(subkey, body, hashlib.sha256).digest()


def _read_text(data: bytes, pos: int) -> tuple[str, int]:
    if pos + 2 > len(data):
        raise CursorTokenError("truncated claims")
    (size,) = _U16.unpack_from(data, pos)
    end = pos + 2 + size
    if end > len(data):
        raise CursorTokenError("truncated claims")
    try:
        return data[pos + 2 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise CursorTokenError("claims are not UTF-8") from None


def verify_cursor(token: bytes, ring: CursorKeyRing) -> CursorClaims:
    """The claims of a token we signed with a key still in ``ring``; else CursorTokenError."""
    if len(token) < 2 + _TAG_SIZE or token[0] != CURSOR_TOKEN_VERSION:
        raise CursorTokenError("not a cursor token of a known version")
    kid_end = 2 + token[1]
    try:
        kid = token[2:kid_end].decode("ascii")
    except UnicodeDecodeError:
        raise CursorTokenError("malformed kid") from None
    subkey = ring.subkey(kid)
    if subkey is None:
        raise CursorTokenError("signing key is not in the ring")
    body, tag = token[:-_TAG_SIZE], token[-_TAG_SIZE:]
    if not hmac.compare_digest(hmac.new(subkey, body, hashlib.sha256).digest(), tag):
        raise CursorTokenError("bad signature")
    # Only our own bytes from here on: a parse failure is an old layout, still "invalid".
    tenant, pos = _read_text(body, kid_end)
    user, pos = _read_text(body, pos)
    device, pos = _read_text(body, pos)
    if len(body) - pos != _TAIL.size:
        raise CursorTokenError("claims have the wrong length")
    shard, lane, epoch, issued_at = _TAIL.unpack_from(body, pos)
    if epoch > MAX_EPOCH:
        raise CursorTokenError("shard_epoch out of range")
    return CursorClaims(tenant, user, device, shard, lane, epoch, issued_at)
