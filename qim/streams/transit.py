"""The transit seal of ``qim.to-gateway`` (topology.md decision 44).

The decrypt points of spec 21.3.4 (the MailboxNode, the writer's history reader) open bodies
before they answer, and their answers reach the ConnectionNode through Kafka: without this
seal, every MAILBOX_BATCH, PUSH_EVENTS, HISTORY_BATCH and session preview would sit in clear in
the to-gateway log segments for its retention. So each producer of to-gateway records that can
carry a body seals the whole record value (AES-256-GCM, random nonce, AAD a fixed label) under
the transit key, and the ConnectionNode opens it where every to-gateway record enters
(``ConversationRouter.deliver``). Records without the magic pass through, so an unsealed
producer (a unit test, an older worker) still works.

The transit key is not part of the erasure hierarchy: it is never destroyed, and the copies it
protects go away with the topic's retention (1 h), not with a key. It comes from
``QIM_TRANSIT_KEY_FILE`` (32 bytes base64url), or for the local and test stacks from
``<repo>/.run/transit-key``, generated once (mode 0600) and shared by every process of the
checkout, in-process test gateways included. Never logged.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "DEFAULT_TRANSIT_KEY_PATH",
    "ENV_TRANSIT_KEY_FILE",
    "TransitError",
    "TransitSealer",
    "load_key_file",
    "load_transit_sealer",
]

ENV_TRANSIT_KEY_FILE: Final = "QIM_TRANSIT_KEY_FILE"
DEFAULT_TRANSIT_KEY_PATH: Final = Path(__file__).resolve().parents[2] / ".run" / "transit-key"
MAGIC: Final = b"QT1"
_AAD: Final = b"qim/to-gateway/v1"
_NONCE: Final = 12


class TransitError(ValueError):
    """A sealed to-gateway value that does not open (another key, tampered)."""


@dataclass(frozen=True)
class TransitSealer:
    key: bytes

    def __post_init__(self) -> None:
        if len(self.key) != 32:
            raise ValueError("the transit key must be 32 bytes")

    def __repr__(self) -> str:  # never print the key
        return "TransitSealer()"

    def seal(self, value: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return MAGIC + nonce + AESGCM(self.key).encrypt(nonce, value, _AAD)

    def open(self, value: bytes) -> bytes:
        """The record value; unchanged when it carries no transit seal."""
        if not value.startswith(MAGIC):
            return value
        body = value[len(MAGIC) :]
        try:
            return AESGCM(self.key).decrypt(body[:_NONCE], body[_NONCE:], _AAD)
        except InvalidTag as exc:
            raise TransitError("to-gateway value does not open") from exc


def _generate(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=") + "\n")
        with contextlib.suppress(FileExistsError):  # a concurrent first start won
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_key_file(path: Path) -> bytes:
    """A 32-byte key from a one-line base64url file, generated first if it does not exist."""
    if not path.exists():
        _generate(path)
    text = path.read_text().strip()
    key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(key) != 32:
        raise ValueError(f"{path}: a key file holds 32 bytes")
    return key


def load_transit_sealer(environ: Mapping[str, str] = os.environ) -> TransitSealer:
    configured = environ.get(ENV_TRANSIT_KEY_FILE, "")
    return TransitSealer(
        load_key_file(Path(configured) if configured else DEFAULT_TRANSIT_KEY_PATH)
    )
