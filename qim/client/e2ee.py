"""The SDK's E2EE key material (client side only: the server never runs this, spec 22.2).

A reference implementation on ``cryptography``, not a hardened product: private keys live in
this object's memory and nowhere else. What it makes is exactly what the server checks
(``qim.core.e2ee.prekeys``):

* ``identity_pub`` = Ed25519 public key (signs the SignedPreKey) || X25519 public key (the X3DH
  identity DH key);
* the SignedPreKey is X25519, signed with Ed25519 over ``signed_prekey_message(key_id, pub)``;
* one-time prekeys are X25519 with ids that only grow (the server never re-offers an id at or
  below the highest it handed out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from qim.core.e2ee.prekeys import signed_prekey_message
from qim.schemas.frames import OneTimePreKey, PrekeyPublish, SignedPreKey

__all__ = ["DeviceKeys", "raw_public"]


def raw_public(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass
class DeviceKeys:
    """One device's key pairs: identity (signing + DH), the SignedPreKey, one-time prekeys."""

    signing: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    identity_dh: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    signed_prekey_id: int = 1
    signed_prekey: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    one_time: dict[int, X25519PrivateKey] = field(default_factory=dict)
    next_one_time_id: int = 1

    @property
    def identity_pub(self) -> bytes:
        return raw_public(self.signing) + raw_public(self.identity_dh)

    def signed_prekey_frame(self) -> SignedPreKey:
        pub = raw_public(self.signed_prekey)
        signature = self.signing.sign(signed_prekey_message(self.signed_prekey_id, pub))
        return SignedPreKey(key_id=self.signed_prekey_id, pub=pub, signature=signature)

    def add_one_time(self, count: int) -> None:
        """Make ``count`` new one-time prekeys (ids continue upwards)."""
        for _ in range(count):
            self.one_time[self.next_one_time_id] = X25519PrivateKey.generate()
            self.next_one_time_id += 1

    def rotate_signed_prekey(self) -> None:
        """A new SignedPreKey (every ``e2ee_signed_prekey_rotation_days``)."""
        self.signed_prekey_id += 1
        self.signed_prekey = X25519PrivateKey.generate()

    def publish_frame(self) -> PrekeyPublish:
        """The whole bundle, every one-time key still held (A.3 #23 is an overwrite)."""
        return PrekeyPublish(
            identity_pub=self.identity_pub,
            signed_prekey=self.signed_prekey_frame(),
            one_time_prekeys=tuple(
                OneTimePreKey(key_id=i, pub=raw_public(k)) for i, k in sorted(self.one_time.items())
            ),
        )

    def take_one_time(self, key_id: int) -> X25519PrivateKey:
        """The private half of a one-time key a peer used; deleted here (used once)."""
        return self.one_time.pop(key_id)
