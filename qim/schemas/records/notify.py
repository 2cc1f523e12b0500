"""The NotificationService's records (spec 16): device-token commands, the digest, PushTasks.

Pure: no Kafka here. Every record is keyed ``(tenant_id, user_id, device_id)`` in the canonical
multi-field encoding (:func:`qim.schemas.hash_input`) and sits in the **explicit partition =
the user's mailbox_shard_id**, like the presence topic (16.6: "partitioned by the same
user_bucket"). So the command topic, the PushTask topic, the DeviceToken table's changelog and
the ``device_token_digest`` topic are co-partitioned: the worker that owns partition p of one
owns it of all, and a 410 seen while sending a PushTask deletes the token in the same partition
the registration wrote it to.

* :class:`DeviceTokenCommand` (HTTP management API -> NotificationService): register /
  overwrite / delete. The token is **sealed before it is produced** (AES-GCM, see
  ``qim.agents.notify.sealing``), so no plaintext push token is ever in Kafka.
* :class:`DeviceTokenDelete` (the API, a provider's "token dead" answer, the 16.6 GC) and
  :class:`DeviceTokenSuccess` (a delivered push: ``last_success_at``), service -> itself.
* :class:`DeviceToken`: the NotificationService's internal table value (16.6); never read by
  anyone else (17.3).
* :class:`DeviceTokenDigest`: the external contract on the compacted ``device_token_digest``
  topic: provider, capabilities and the bundle_env validity flag, **no token ciphertext**; a
  null value is the tombstone of a deletion.
* :class:`PushTask` (MailboxNode -> NotificationService, 16.1.1) with the badge numbers of the
  same UserBadgeState as BADGE_UPDATE (16.3).

Values are msgpack maps (msgspec), defaults omitted and unknown keys ignored on decode, so
fields can be added (27.2.1).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from qim.schemas.hashing import hash_input
from qim.schemas.records.presence import PresenceKey

__all__ = [
    "BUNDLE_ENVS",
    "PROVIDERS",
    "VOIP_DEVICE",
    "BundleEnv",
    "DeviceKey",
    "DeviceToken",
    "DeviceTokenCommand",
    "DeviceTokenDelete",
    "DeviceTokenDigest",
    "DeviceTokenSuccess",
    "Provider",
    "PushKind",
    "PushTask",
    "decode_command",
    "decode_device_token",
    "decode_digest",
    "decode_push_task",
    "decode_user_devices",
    "digest_of",
    "encode",
    "encode_user_devices",
    "user_devices_key",
]

Provider = Literal["APNS", "FCM", "HUAWEI", "XIAOMI", "OPPO", "VIVO", "WEBPUSH"]
PROVIDERS: Final[frozenset[str]] = frozenset(
    {"APNS", "FCM", "HUAWEI", "XIAOMI", "OPPO", "VIVO", "WEBPUSH"}
)
BundleEnv = Literal["production", "sandbox"]
BUNDLE_ENVS: Final[frozenset[str]] = frozenset({"production", "sandbox"})
PushKind = Literal["alert", "badge", "voip"]
"""``alert``: a notification (banner/sound) with the badge; ``badge``: silent badge-only;
``voip``: an incoming call (13.5.2), a high-priority VoIP / FCM-high push, no badge."""
VOIP_DEVICE: Final = "*"
"""The ``device_id`` of a ``voip`` PushTask: the callee's gateway knows no online device and
no tokens, so the task names the user and the NotificationService expands it to the user's
devices that registered the ``voip`` capability (13.5.2)."""


DeviceKey = PresenceKey
"""The primary key of a DeviceToken, a digest record and a PushTask (16.1.1, 16.6): the same
(tenant, user, device) key, encoding and partition rule as presence, so the digest and the push
tasks are co-partitioned with the user's mailbox shard (5.4.2 / 16.6)."""


class _Record(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=False, frozen=True
):
    pass


class DeviceTokenCommand(_Record, frozen=True, tag_field="op", tag="register"):
    """Register or overwrite the token of (tenant, user, device); ``sealed_token`` is AES-GCM
    ciphertext bound to the key, ``token_fingerprint`` the keyed hash the dedup key and a
    provider's deletion match on (never the plaintext)."""

    request_id: str
    tenant_id: str
    user_id: str
    device_id: str
    provider: str
    sealed_token: bytes
    token_fingerprint: str
    bundle_env: str = "production"
    client_platform: str = ""
    app_version: str = ""
    locale: str = ""
    timezone: str = ""
    capabilities: tuple[str, ...] = ()
    sealed_voip_token: bytes = b""
    voip_token_fingerprint: str = ""
    at_ms: int = 0

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.tenant_id, self.user_id, self.device_id)


class DeviceTokenDelete(_Record, frozen=True, tag_field="op", tag="delete"):
    """Delete a device's token. ``token_fingerprint`` set: only if the stored token is still
    that one (a provider's 410 for an old token must not delete a newer registration).
    ``scope="voip"``: only the device's VoIP (PushKit) token goes, conditionally on
    ``token_fingerprint`` being the stored ``voip_token_fingerprint``; its alert token stays."""

    request_id: str
    tenant_id: str
    user_id: str
    device_id: str
    reason: str
    token_fingerprint: str = ""
    scope: str = ""
    at_ms: int = 0

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.tenant_id, self.user_id, self.device_id)


class DeviceTokenSuccess(_Record, frozen=True, tag_field="op", tag="success"):
    """A provider accepted a push to this token at ``at_ms``: moves ``last_success_at`` (16.6
    GC), only if the stored token is still ``token_fingerprint`` and the time is newer."""

    request_id: str
    tenant_id: str
    user_id: str
    device_id: str
    token_fingerprint: str
    at_ms: int

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.tenant_id, self.user_id, self.device_id)


class DeviceToken(_Record, frozen=True):
    """The internal table value (16.6 field list); the token only as ``sealed_token``."""

    tenant_id: str
    user_id: str
    device_id: str
    provider: str
    sealed_token: bytes
    token_fingerprint: str
    bundle_env: str = "production"
    client_platform: str = ""
    app_version: str = ""
    locale: str = ""
    timezone: str = ""
    capabilities: tuple[str, ...] = ()
    sealed_voip_token: bytes = b""
    voip_token_fingerprint: str = ""
    registered_at: int = 0
    last_success_at: int = 0
    last_failure_code: str = ""

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.tenant_id, self.user_id, self.device_id)


class DeviceTokenDigest(_Record, frozen=True):
    """``device_token_digest`` value (16.6): what D(user) needs, no token material."""

    provider: str
    capabilities: tuple[str, ...] = ()
    bundle_env: str = "production"
    bundle_env_valid: bool = True


class PushTask(_Record, frozen=True):
    """16.1.1 PushTask, per device, plus the 16.3 badge numbers read from UserBadgeState.

    ``kind="badge"`` is a silent badge update (a read elsewhere, a badge reaching 0); it has no
    message and is never merged into an alert. ``committed_at`` is the message's commit time
    (materialized state never reads a wall clock).

    ``kind="voip"`` (13.5.2) is an RTC ``invite`` for a callee with no online device, produced
    by the callee's ConnectionNode with ``device_id`` = :data:`VOIP_DEVICE` and ``event_id``
    ``rtc:<call_id>``; it carries the call (``call_id``, ``caller_user_id`` /
    ``caller_device_id``, ``conversation_id``) and the two ConnectionShards the service answers
    on when no device could be pushed (``caller_connection_shard``, ``callee_connection_shard``).
    No badge numbers: a VoIP push never writes or shows a badge.
    """

    tenant_id: str
    user_id: str
    device_id: str
    event_id: str
    mailbox_seq: int
    kind: str = "alert"
    conversation_id: str = ""
    message_id: str = ""
    conversation_type: str = "SINGLE"
    counts_unread: bool = True
    mention_type: str = "NONE"
    preview_or_placeholder: str = ""
    total_unread: int = 0
    total_mention: int = 0
    muted_unread: int = 0
    badge_projection_mailbox_seq: int = 0
    committed_at: int = 0
    e2ee: bool = False
    """An E2EE conversation's alert (16.7): placeholder text only, the client decrypts
    (APNs ``mutable-content``, FCM data-only)."""
    call_id: str = ""
    caller_user_id: str = ""
    caller_device_id: str = ""
    caller_connection_shard: int = 0
    callee_connection_shard: int = 0

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.tenant_id, self.user_id, self.device_id)


Command = DeviceTokenCommand | DeviceTokenDelete | DeviceTokenSuccess

_ENCODER: Final = msgspec.msgpack.Encoder()
_COMMANDS: Final = msgspec.msgpack.Decoder(Command)
_TOKENS: Final = msgspec.msgpack.Decoder(DeviceToken)
_DIGESTS: Final = msgspec.msgpack.Decoder(DeviceTokenDigest)
_TASKS: Final = msgspec.msgpack.Decoder(PushTask)


def encode(record: _Record) -> bytes:
    return _ENCODER.encode(record)


def decode_command(value: bytes) -> Command:
    command: Command = _COMMANDS.decode(value)
    return command


def decode_device_token(value: bytes | None) -> DeviceToken | None:
    return None if value is None else _TOKENS.decode(value)


def decode_digest(value: bytes | None) -> DeviceTokenDigest | None:
    """None for a tombstone (the device's token was deleted)."""
    return None if value is None else _DIGESTS.decode(value)


def decode_push_task(value: bytes) -> PushTask:
    return _TASKS.decode(value)


def digest_of(token: DeviceToken) -> DeviceTokenDigest:
    """The digest of a stored token: never the ciphertext, never the fingerprint."""
    return DeviceTokenDigest(
        provider=token.provider,
        capabilities=token.capabilities,
        bundle_env=token.bundle_env,
        bundle_env_valid=token.provider != "APNS" or token.bundle_env in BUNDLE_ENVS,
    )


_USER_DEVICES: Final = msgspec.msgpack.Decoder(tuple[str, ...])


def user_devices_key(tenant_id: str, user_id: str) -> bytes:
    """The NotificationService's per-user index key (its ``user_devices`` table): the device
    ids of a user with a stored token, so a ``voip`` PushTask finds them without a scan."""
    return hash_input(tenant_id, user_id)


def encode_user_devices(devices: tuple[str, ...]) -> bytes:
    return _ENCODER.encode(tuple(sorted(set(devices))))


def decode_user_devices(value: bytes | None) -> tuple[str, ...]:
    return () if value is None else _USER_DEVICES.decode(value)
