"""E2EE key frames, opcodes 0x0800-0x08FF: PREKEY_PUBLISH, PREKEY_FETCH (§7.14, §22.2).

PREKEY_FETCH is bidirectional on one opcode: ``PrekeyFetch`` is the request (uplink),
``PrekeyFetchDown`` the bundles (downlink).
"""

from __future__ import annotations

from qim.schemas.frames.base import U32, Body

__all__ = [
    "OneTimePreKey",
    "PrekeyBundle",
    "PrekeyFetch",
    "PrekeyFetchDown",
    "PrekeyPublish",
    "SignedPreKey",
]


class SignedPreKey(Body):
    key_id: U32 = 0
    pub: bytes = b""
    signature: bytes = b""


class OneTimePreKey(Body):
    key_id: U32 = 0
    pub: bytes = b""


class PrekeyPublish(Body):
    """PREKEY_PUBLISH (A.3 #23): whole-bundle overwrite of the DevicePreKeyBundle."""

    identity_pub: bytes = b""
    signed_prekey: SignedPreKey | None = None
    one_time_prekeys: tuple[OneTimePreKey, ...] = ()


class PrekeyFetch(Body):
    """PREKEY_FETCH uplink (A.3 #24): empty ``target_device_ids`` = all the user's devices."""

    target_user_id: str = ""
    target_device_ids: tuple[str, ...] = ()


class PrekeyBundle(Body):
    """One ``PREKEY_FETCH.bundles[]`` item; each one-time prekey is handed out once."""

    device_id: str = ""
    identity_pub: bytes = b""
    signed_prekey: SignedPreKey | None = None
    one_time_prekey: OneTimePreKey | None = None
    one_time_exhausted: bool = False
    one_time_remaining: U32 = 0
    """[ext] How many one-time prekeys the server still holds for this device; set only in
    the owner's own view (the reply to PREKEY_PUBLISH and the server-initiated low-water
    PREKEY_FETCH with ``request_id=0``), omitted (0) in a bundle handed to another user."""


class PrekeyFetchDown(Body):
    """PREKEY_FETCH downlink (A.4 #17)."""

    bundles: tuple[PrekeyBundle, ...] = ()
