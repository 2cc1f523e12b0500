"""Push tokens encrypted at rest (16.6 "token (stored encrypted)"): AES-256-GCM with a key ring.

Why seal at the HTTP edge: the token is sealed before the registration command is produced,
so neither the command topic, the DeviceToken table, its RocksDB files nor its changelog ever
hold a plaintext push token; only the worker that sends opens it, in memory.

Sealed form: ``b"g1" | kid_len u8 | kid | nonce(12) | ciphertext+tag``. The associated data is
the record key ``(tenant, user, device)``, so a ciphertext copied onto another device's record
does not open. ``fingerprint`` is HMAC-SHA256 (a subkey of the active key) of the token, the
stable name of a token for the dedup key (device_token, event_id) and for "delete only if it
is still this token", without the plaintext.

Keys: ``QIM_PUSH_TOKEN_KEYS`` (``kid:base64url-32-bytes`` comma-separated, first one seals,
all open: rotate by putting a new key first) or, for the local stack, a file made once under
the stack folder (``QIM_PUSH_TOKEN_KEYS_FILE``, default ``.run/push-token-keys``), like the
auth signing keys.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from qim.schemas.records.notify import DeviceKey

__all__ = ["ENV_KEYS", "ENV_KEYS_FILE", "SealError", "TokenSealer", "load_sealer", "voip_aad"]

ENV_KEYS: Final = "QIM_PUSH_TOKEN_KEYS"
ENV_KEYS_FILE: Final = "QIM_PUSH_TOKEN_KEYS_FILE"
DEFAULT_KEYS_PATH: Final = Path(__file__).resolve().parents[3] / ".run" / "push-token-keys"
_MAGIC: Final = b"g1"


class SealError(ValueError):
    """A sealed token that does not open: unknown key, tampered, or another record's."""


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class TokenSealer:
    keys: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("at least one push-token key is needed")
        for kid, key in self.keys:
            if not kid or len(kid) > 32 or len(key) != 32:
                raise ValueError("push-token keys are kid:32 bytes")

    @classmethod
    def parse(cls, text: str) -> TokenSealer:
        keys = []
        for part in text.replace("\n", ",").split(","):
            part = part.strip()
            if part:
                kid, _, secret = part.partition(":")
                keys.append((kid, _b64d(secret)))
        return cls(tuple(keys))

    @staticmethod
    def generate_line(kid: str = "dev1") -> str:
        return f"{kid}:{base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip('=')}"

    def fingerprint(self, token: str) -> str:
        subkey = hmac.new(self.keys[0][1], b"qim-push-token-fingerprint", hashlib.sha256).digest()
        return hmac.new(subkey, token.encode(), hashlib.sha256).hexdigest()[:32]

    def seal(self, token: str, aad: bytes) -> bytes:
        kid, key = self.keys[0]
        nonce = secrets.token_bytes(12)
        kid_raw = kid.encode()
        body = AESGCM(key).encrypt(nonce, token.encode(), aad)
        return _MAGIC + bytes([len(kid_raw)]) + kid_raw + nonce + body

    def open(self, sealed: bytes, aad: bytes) -> str:
        if not sealed.startswith(_MAGIC) or len(sealed) < 4:
            raise SealError("not a sealed token")
        n = sealed[2]
        kid, rest = sealed[3 : 3 + n].decode(errors="replace"), sealed[3 + n :]
        key = dict(self.keys).get(kid)
        if key is None:
            raise SealError(f"unknown push-token key {kid!r}")
        try:
            return AESGCM(key).decrypt(rest[:12], rest[12:], aad).decode()
        except Exception as exc:  # cryptography raises InvalidTag
            raise SealError("sealed token does not open") from exc


def voip_aad(key: DeviceKey) -> bytes:
    """The associated data a device's VoIP token is sealed with: its key and a label, so a
    sealed VoIP token never opens as the device's alert token or the other way round."""
    return key.encode() + b"/voip"


def _dev_keys(path: Path) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(TokenSealer.generate_line() + "\n")
            with contextlib.suppress(FileExistsError):  # a concurrent first start won
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text()


def load_sealer(env: Mapping[str, str] | None = None) -> TokenSealer:
    env = os.environ if env is None else env
    spec = env.get(ENV_KEYS, "").strip()
    if spec:
        return TokenSealer.parse(spec)
    override = env.get(ENV_KEYS_FILE, "").strip()
    return TokenSealer.parse(_dev_keys(Path(override) if override else DEFAULT_KEYS_PATH))
