"""The SDK's reference X3DH + Double Ratchet + sender keys (spec 22.2), on ``cryptography``.

**Client side only.** The server stores public keys and relays ciphertext; nothing under
``qim/`` but the SDK imports this. It follows Signal's published X3DH and Double Ratchet
specifications closely enough for the tests to run the real flow end to end; it is a
reference, not an audited product (no header encryption, no persistence of session state).

The storage model of 22.2: **one body ciphertext per message** for every endpoint, sealed with
the sender's *sender key* (:func:`seal` / :func:`open_sealed`, AES-256-GCM, AAD = the
conversation id); the sender key itself goes to each recipient device (and the sender's own
other devices) over a pairwise :class:`RatchetSession`, as a :class:`KeyDistribution`.

X3DH (initiator A, responder B's PREKEY_FETCH bundle)::

    verify B.signed_prekey.signature with the Ed25519 half of B.identity_pub
    DH1 = DH(IK_A, SPK_B)  DH2 = DH(EK_A, IK_B)  DH3 = DH(EK_A, SPK_B)  [DH4 = DH(EK_A, OPK_B)]
    SK  = HKDF-SHA256(0xFF*32 || DH1 || DH2 || DH3 [|| DH4], salt=0*32, info="qim.x3dh.v1")
    AD  = A.identity_pub || B.identity_pub          (IK_* = the X25519 halves)

Ratchet message wire form: ``dh_pub (32) || pn (u32 BE) || n (u32 BE) || AES-GCM(ct)``; the
first message of a session is prefixed by :class:`InitialMessage` fields (who, which keys).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final

import msgspec
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from qim.client.e2ee import DeviceKeys, raw_public
from qim.core.e2ee.prekeys import signed_prekey_message
from qim.schemas.frames import PrekeyBundle

__all__ = [
    "InitialMessage",
    "KeyDistribution",
    "RatchetSession",
    "accept",
    "initiate",
    "open_sealed",
    "seal",
]

_INFO_X3DH: Final = b"qim.x3dh.v1"
_INFO_RK: Final = b"qim.ratchet.rk.v1"
_INFO_MK: Final = b"qim.ratchet.mk.v1"
_HEADER: Final = 32 + 4 + 4
MAX_SKIP: Final = 1000


def _hkdf(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def _dh(priv: X25519PrivateKey, pub: bytes) -> bytes:
    return priv.exchange(X25519PublicKey.from_public_bytes(pub))


def _kdf_rk(rk: bytes, dh_out: bytes) -> tuple[bytes, bytes]:
    out = _hkdf(dh_out, salt=rk, info=_INFO_RK, length=64)
    return out[:32], out[32:]


def _kdf_ck(ck: bytes) -> tuple[bytes, bytes]:
    def mac(byte: bytes) -> bytes:
        h = hmac.HMAC(ck, hashes.SHA256())
        h.update(byte)
        return h.finalize()

    return mac(b"\x02"), mac(b"\x01")  # next chain key, message key


def _aead(mk: bytes) -> tuple[AESGCM, bytes]:
    out = _hkdf(mk, salt=b"\x00" * 32, info=_INFO_MK, length=44)
    return AESGCM(out[:32]), out[32:]


class InitialMessage(msgspec.Struct, frozen=True, array_like=True):
    """What the responder needs to run X3DH from its side, plus the first ratchet message."""

    identity_pub: bytes  # the initiator's (64 bytes: Ed25519 || X25519)
    ephemeral_pub: bytes
    signed_prekey_id: int
    one_time_prekey_id: int  # 0: none was left (the SignedPreKey fallback)
    ratchet: bytes


class KeyDistribution(msgspec.Struct, frozen=True):
    """The sender key of (sender device, conversation), one ratchet message per target device;
    the payload of the E2EE_KEY_DIST message (22.2). ``envelopes`` maps ``user/device``."""

    sender: str  # "user/device" of the sender
    key_id: int
    envelopes: dict[str, bytes]


@dataclass
class RatchetSession:
    """One pairwise Double Ratchet session (Signal's algorithm, without header encryption)."""

    ad: bytes
    rk: bytes
    dhs: X25519PrivateKey
    dhr: bytes | None = None
    cks: bytes | None = None
    ckr: bytes | None = None
    ns: int = 0
    nr: int = 0
    pn: int = 0
    skipped: dict[tuple[bytes, int], bytes] = field(default_factory=dict)

    def encrypt(self, plaintext: bytes) -> bytes:
        assert self.cks is not None, "a responder sends only after it received"
        self.cks, mk = _kdf_ck(self.cks)
        header = raw_public(self.dhs) + self.pn.to_bytes(4, "big") + self.ns.to_bytes(4, "big")
        self.ns += 1
        aead, nonce = _aead(mk)
        return header + aead.encrypt(nonce, plaintext, self.ad + header)

    def decrypt(self, message: bytes) -> bytes:
        header, body = message[:_HEADER], message[_HEADER:]
        dh = header[:32]
        pn = int.from_bytes(header[32:36], "big")
        n = int.from_bytes(header[36:40], "big")
        mk = self.skipped.pop((dh, n), None)
        if mk is None:
            if dh != self.dhr:
                self._skip(pn)
                self._dh_ratchet(dh)
            self._skip(n)
            assert self.ckr is not None
            self.ckr, mk = _kdf_ck(self.ckr)
            self.nr += 1
        aead, nonce = _aead(mk)
        return aead.decrypt(nonce, body, self.ad + header)

    def _skip(self, until: int) -> None:
        if self.ckr is None:
            return
        if until - self.nr > MAX_SKIP:
            raise ValueError("too many skipped messages")
        while self.nr < until:
            self.ckr, mk = _kdf_ck(self.ckr)
            assert self.dhr is not None
            self.skipped[(self.dhr, self.nr)] = mk
            self.nr += 1

    def _dh_ratchet(self, dh: bytes) -> None:
        self.pn, self.ns, self.nr = self.ns, 0, 0
        self.dhr = dh
        self.rk, self.ckr = _kdf_rk(self.rk, _dh(self.dhs, dh))
        self.dhs = X25519PrivateKey.generate()
        self.rk, self.cks = _kdf_rk(self.rk, _dh(self.dhs, dh))


def initiate(mine: DeviceKeys, bundle: PrekeyBundle, first: bytes) -> tuple[RatchetSession, bytes]:
    """X3DH from a fetched bundle; the session and the InitialMessage (bytes) carrying
    ``first`` (raises ``InvalidSignature`` when the SignedPreKey is not signed by the bundle's
    identity)."""
    spk = bundle.signed_prekey
    if spk is None or len(bundle.identity_pub) != 64:
        raise ValueError("bundle without a SignedPreKey or identity")
    Ed25519PublicKey.from_public_bytes(bundle.identity_pub[:32]).verify(
        spk.signature, signed_prekey_message(spk.key_id, spk.pub)
    )
    ephemeral = X25519PrivateKey.generate()
    dhs = [
        _dh(mine.identity_dh, spk.pub),
        _dh(ephemeral, bundle.identity_pub[32:]),
        _dh(ephemeral, spk.pub),
    ]
    opk = bundle.one_time_prekey
    if opk is not None:
        dhs.append(_dh(ephemeral, opk.pub))
    sk = _hkdf(b"\xff" * 32 + b"".join(dhs), salt=b"\x00" * 32, info=_INFO_X3DH, length=32)
    ad = mine.identity_pub + bundle.identity_pub
    session = RatchetSession(ad=ad, rk=sk, dhs=X25519PrivateKey.generate(), dhr=spk.pub)
    session.rk, session.cks = _kdf_rk(sk, _dh(session.dhs, spk.pub))
    initial = InitialMessage(
        identity_pub=mine.identity_pub,
        ephemeral_pub=raw_public(ephemeral),
        signed_prekey_id=spk.key_id,
        one_time_prekey_id=0 if opk is None else opk.key_id,
        ratchet=session.encrypt(first),
    )
    return session, msgspec.msgpack.encode(initial)


def accept(mine: DeviceKeys, initial_bytes: bytes) -> tuple[RatchetSession, bytes]:
    """The responder's side of X3DH: the session and the first plaintext. The one-time prekey
    used is deleted from ``mine`` (it is never used twice)."""
    initial = msgspec.msgpack.decode(initial_bytes, type=InitialMessage)
    if initial.signed_prekey_id != mine.signed_prekey_id:
        raise ValueError("unknown signed prekey")
    their_dh = initial.identity_pub[32:]
    dhs = [
        _dh(mine.signed_prekey, their_dh),
        _dh(mine.identity_dh, initial.ephemeral_pub),
        _dh(mine.signed_prekey, initial.ephemeral_pub),
    ]
    if initial.one_time_prekey_id:
        dhs.append(_dh(mine.take_one_time(initial.one_time_prekey_id), initial.ephemeral_pub))
    sk = _hkdf(b"\xff" * 32 + b"".join(dhs), salt=b"\x00" * 32, info=_INFO_X3DH, length=32)
    ad = initial.identity_pub + mine.identity_pub
    session = RatchetSession(ad=ad, rk=sk, dhs=mine.signed_prekey)
    return session, session.decrypt(initial.ratchet)


def seal(sender_key: bytes, conversation_id: str, plaintext: bytes) -> bytes:
    """The one body ciphertext of a message: ``nonce (12) || AES-256-GCM``, AAD = conversation."""
    nonce = os.urandom(12)
    return nonce + AESGCM(sender_key).encrypt(nonce, plaintext, conversation_id.encode())


def open_sealed(sender_key: bytes, conversation_id: str, sealed: bytes) -> bytes:
    return AESGCM(sender_key).decrypt(sealed[:12], sealed[12:], conversation_id.encode())
