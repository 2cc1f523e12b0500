"""DevicePreKeyBundle rules (spec 7.14, 22.2, A.3 #23-#24, A.6 #16) as pure functions.

The server stores public keys only and hands each one-time prekey out once. Everything here is
a function of its arguments (no clock, no randomness, no iteration-order dependence), so the
one owner of a user's key partition (``qim.apps.keys``) serialises every publish and fetch of
that user by calling these in log order, and a replay of the same requests yields the same
bundles.

Key formats (ours; the documents name no algorithm):

* ``identity_pub`` = 64 bytes: the Ed25519 public key that signs the SignedPreKey (32) followed
  by the X25519 public key the device uses as its X3DH identity DH key (32). Two halves because
  ``cryptography`` has no Ed25519 <-> X25519 conversion (Signal's XEdDSA);
* ``SignedPreKey.pub`` / ``OneTimePreKey.pub`` = 32-byte X25519 public keys;
* ``SignedPreKey.signature`` = Ed25519 over :func:`signed_prekey_message` (a context string,
  the key id big-endian, the public key): binding the id stops a replayed signature from
  re-labelling an old key.

Rules:

* PREKEY_PUBLISH is a whole-bundle overwrite (A.3 #23). It is refused (nothing stored) with
  ``PERMISSION_DENIED`` + a ``detail`` when a key is malformed or the signature does not verify,
  and with ``PAYLOAD_TOO_LARGE`` when it carries more than :data:`MAX_ONE_TIME_PREKEYS`.
* One-time prekeys are handed out lowest ``key_id`` first; ``handed_through`` remembers the
  highest id ever handed out for this identity, and a later publish drops every one-time key at
  or below it, so a device that re-uploads a key someone already took cannot make the server
  hand it out twice. Key ids must therefore grow (the SDK's do). A new ``identity_pub`` is a
  new device key space and starts from zero.
* PREKEY_FETCH names a user and optionally devices (none = all of the user's devices with a
  bundle, in device-id order; unknown ids are skipped). Each device yields one bundle with its
  lowest one-time key, or, when it has none left, the SignedPreKey alone with
  ``one_time_exhausted=true`` -- unless the tenant forbids that fallback, in which case the
  whole fetch is ``PREKEY_EXHAUSTED`` and consumes nothing (a partial answer would spend keys
  on a session the client cannot complete; it can retry naming only the other devices).
* Low water: a fetch that takes a device from ``>= e2ee_prekey_low_watermark`` one-time keys
  to fewer, or to none, tells the owner device to top up (:func:`crossed_low_water`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from qim.schemas.frames import (
    ErrorCode,
    OneTimePreKey,
    PrekeyBundle,
    PrekeyFetch,
    PrekeyPublish,
    SignedPreKey,
)

__all__ = [
    "IDENTITY_PUB_BYTES",
    "MAX_ONE_TIME_PREKEYS",
    "DeviceBundle",
    "FetchOutcome",
    "Refusal",
    "StoredKey",
    "UserBundles",
    "check_publish",
    "crossed_low_water",
    "decode_user_bundles",
    "encode_user_bundles",
    "fetch",
    "own_status",
    "publish",
    "signed_prekey_message",
]

SIGNED_PREKEY_CONTEXT: Final = b"qim.signed_prekey.v1\x00"
IDENTITY_PUB_BYTES: Final = 64  # Ed25519 signing half + X25519 agreement half
KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
MAX_ONE_TIME_PREKEYS: Final = 200
"""One-time prekeys a device may hold on the server (ours: Appendix B names only the refill
watermark, 20; ten times that bounds a user's value at 8 devices x 200 x ~40 bytes)."""


class StoredKey(msgspec.Struct, frozen=True, array_like=True):
    key_id: int
    pub: bytes


class DeviceBundle(msgspec.Struct, frozen=True, array_like=True):
    """One device's DevicePreKeyBundle as stored (7.14 PK ((tenant, user), device))."""

    identity_pub: bytes
    signed_prekey: StoredKey
    signature: bytes
    one_time: tuple[StoredKey, ...] = ()  # ascending key_id
    handed_through: int = 0  # highest one-time key_id ever handed out (0: none)


class UserBundles(msgspec.Struct, frozen=True, array_like=True):
    """Every device bundle of one user: the value of the table row keyed (tenant, user)."""

    devices: tuple[tuple[str, DeviceBundle], ...] = ()  # ascending device_id

    def as_dict(self) -> dict[str, DeviceBundle]:
        return dict(self.devices)

    @classmethod
    def of(cls, devices: Mapping[str, DeviceBundle]) -> UserBundles:
        return cls(tuple(sorted(devices.items())))


_ENC: Final = msgspec.msgpack.Encoder()
_DEC: Final = msgspec.msgpack.Decoder(UserBundles)


def encode_user_bundles(value: UserBundles) -> bytes:
    return _ENC.encode(value)


def decode_user_bundles(data: bytes | None) -> UserBundles:
    """The stored row; no row (None or empty) is a user with no bundle."""
    return _DEC.decode(data) if data else UserBundles()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the A.6 code and the ERROR's ``detail``."""

    code: ErrorCode
    detail: str


def signed_prekey_message(key_id: int, pub: bytes) -> bytes:
    """What the identity key signs: context, ``key_id`` (u32 big-endian), the public key."""
    return SIGNED_PREKEY_CONTEXT + key_id.to_bytes(4, "big") + pub


def _x25519_ok(pub: bytes) -> bool:
    if len(pub) != KEY_BYTES:
        return False
    try:
        X25519PublicKey.from_public_bytes(pub)
    except ValueError:
        return False
    return True


def check_publish(message: PrekeyPublish) -> Refusal | None:
    """None when the bundle may be stored; else the refusal (keys checked, signature verified
    with the Ed25519 half of ``identity_pub``)."""
    denied = ErrorCode.PERMISSION_DENIED
    if len(message.one_time_prekeys) > MAX_ONE_TIME_PREKEYS:
        return Refusal(ErrorCode.PAYLOAD_TOO_LARGE, f"more than {MAX_ONE_TIME_PREKEYS} prekeys")
    if len(message.identity_pub) != IDENTITY_PUB_BYTES:
        return Refusal(denied, "identity_pub_invalid")
    try:
        signer = Ed25519PublicKey.from_public_bytes(message.identity_pub[:KEY_BYTES])
    except ValueError:
        return Refusal(denied, "identity_pub_invalid")
    if not _x25519_ok(message.identity_pub[KEY_BYTES:]):
        return Refusal(denied, "identity_pub_invalid")
    spk = message.signed_prekey
    if spk is None or not _x25519_ok(spk.pub):
        return Refusal(denied, "signed_prekey_invalid")
    if len(spk.signature) != SIGNATURE_BYTES:
        return Refusal(denied, "signed_prekey_signature_invalid")
    try:
        signer.verify(spk.signature, signed_prekey_message(spk.key_id, spk.pub))
    except InvalidSignature:
        return Refusal(denied, "signed_prekey_signature_invalid")
    ids = [k.key_id for k in message.one_time_prekeys]
    if len(set(ids)) != len(ids) or 0 in ids:
        return Refusal(denied, "one_time_prekey_ids_invalid")
    if not all(_x25519_ok(k.pub) for k in message.one_time_prekeys):
        return Refusal(denied, "one_time_prekey_invalid")
    return None


def publish(old: DeviceBundle | None, message: PrekeyPublish) -> DeviceBundle:
    """The stored bundle after a checked PREKEY_PUBLISH (whole-bundle overwrite): one-time
    keys at or below ``handed_through`` of the same identity are dropped, never re-offered."""
    spk = message.signed_prekey
    assert spk is not None, "check_publish first"
    same_identity = old is not None and old.identity_pub == message.identity_pub
    handed = old.handed_through if old is not None and same_identity else 0
    fresh = sorted(
        (StoredKey(k.key_id, k.pub) for k in message.one_time_prekeys if k.key_id > handed),
        key=lambda k: k.key_id,
    )
    return DeviceBundle(
        identity_pub=message.identity_pub,
        signed_prekey=StoredKey(spk.key_id, spk.pub),
        signature=spk.signature,
        one_time=tuple(fresh),
        handed_through=handed,
    )


def _signed(bundle: DeviceBundle) -> SignedPreKey:
    spk = bundle.signed_prekey
    return SignedPreKey(key_id=spk.key_id, pub=spk.pub, signature=bundle.signature)


def own_status(device_id: str, bundle: DeviceBundle) -> PrekeyBundle:
    """The owner's view of its stored bundle (the reply to PREKEY_PUBLISH and the low-water
    notice): no one-time key, ``one_time_remaining`` = how many are left."""
    return PrekeyBundle(
        device_id=device_id,
        identity_pub=bundle.identity_pub,
        signed_prekey=_signed(bundle),
        one_time_exhausted=not bundle.one_time,
        one_time_remaining=len(bundle.one_time),
    )


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """A fetch's answer and what it changed.

    ``refusal`` set: nothing changed (PREKEY_EXHAUSTED). Otherwise ``bundles`` is the frame's
    list, ``after`` the user's new row, ``fallbacks`` the devices served with the SignedPreKey
    only and ``low_water`` the devices whose owner must be told to top up.
    """

    after: UserBundles
    bundles: tuple[PrekeyBundle, ...] = ()
    fallbacks: tuple[str, ...] = ()
    low_water: tuple[str, ...] = ()
    refusal: Refusal | None = None

    @property
    def changed(self) -> bool:
        return self.refusal is None and any(not b.one_time_exhausted for b in self.bundles)


def crossed_low_water(before: int, after: int, watermark: int) -> bool:
    """Tell the owner: the count fell below the watermark just now, or reached zero now."""
    return after < before and ((before >= watermark > after) or after == 0)


def _targets(devices: Mapping[str, DeviceBundle], wanted: Sequence[str]) -> list[str]:
    if not wanted:
        return sorted(devices)
    seen: set[str] = set()
    out = []
    for device in wanted:  # the client's order, each once, unknown ones skipped
        if device in devices and device not in seen:
            seen.add(device)
            out.append(device)
    return out


def fetch(
    row: UserBundles, message: PrekeyFetch, *, fallback_allowed: bool, low_watermark: int
) -> FetchOutcome:
    """One PREKEY_FETCH against the target user's row (see the module doc)."""
    devices = row.as_dict()
    targets = _targets(devices, message.target_device_ids)
    exhausted = [d for d in targets if not devices[d].one_time]
    if exhausted and not fallback_allowed:
        detail = "one-time prekeys exhausted: " + ",".join(exhausted)
        return FetchOutcome(row, refusal=Refusal(ErrorCode.PREKEY_EXHAUSTED, detail))
    bundles, low = [], []
    for device in targets:
        bundle = devices[device]
        if not bundle.one_time:
            bundles.append(
                PrekeyBundle(
                    device_id=device,
                    identity_pub=bundle.identity_pub,
                    signed_prekey=_signed(bundle),
                    one_time_exhausted=True,
                )
            )
            continue
        taken, rest = bundle.one_time[0], bundle.one_time[1:]
        devices[device] = msgspec.structs.replace(
            bundle, one_time=rest, handed_through=max(bundle.handed_through, taken.key_id)
        )
        bundles.append(
            PrekeyBundle(
                device_id=device,
                identity_pub=bundle.identity_pub,
                signed_prekey=_signed(bundle),
                one_time_prekey=OneTimePreKey(key_id=taken.key_id, pub=taken.pub),
            )
        )
        if crossed_low_water(len(bundle.one_time), len(rest), low_watermark):
            low.append(device)
    return FetchOutcome(
        after=UserBundles.of(devices),
        bundles=tuple(bundles),
        fallbacks=tuple(exhausted),
        low_water=tuple(low),
    )
