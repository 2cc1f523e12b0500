"""Validating a device-token registration (16.6) against the caller's verified identity.

Pure: the caller verified the access token (signature, expiry, revocation) and hands over
who it names and the connection's device and session epoch; this decides whether the request
may be stored. Every refusal names an App. A.6 code: A.6 has no "bad argument" code, and
16.6 / 20.2.2 make a registration for someone else an authorization failure, so all of them
are ``PERMISSION_DENIED`` (client action: do not retry) with a ``detail`` that says which rule;
a body over the limit is ``PAYLOAD_TOO_LARGE``. Nothing is stored on a refusal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from qim.schemas.records.notify import BUNDLE_ENVS

__all__ = [
    "OFFERED_PROVIDERS",
    "Refusal",
    "Registration",
    "validate_registration",
]

OFFERED_PROVIDERS: Final[frozenset[str]] = frozenset({"APNS", "FCM"})
"""Providers this build has a client for; 16.6's vendor channels are refused, not stored, so
no device is counted wakeable (D(user)) that nothing could wake."""

_ID: Final = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# APNs device tokens are 32 bytes today (64 hex chars); Apple says they may grow: up to 100 bytes.
_APNS_TOKEN: Final = re.compile(r"(?:[0-9a-fA-F]{2}){32,100}")
# FCM registration tokens: URL-safe base64 with ':' and '-' / '_', ~150-250 chars.
_FCM_TOKEN: Final = re.compile(r"[A-Za-z0-9_:\-]{32,4096}")
_TEXT_FIELDS: Final = ("client_platform", "app_version", "locale", "timezone")
_MAX_TEXT: Final = 64
_CAPABILITIES: Final = frozenset({"silent_push", "notification_extension", "voip"})


@dataclass(frozen=True, slots=True)
class Refusal(Exception):
    """Why a registration is not stored: an A.6 code and a coarse detail."""

    code: str
    detail: str
    status: int = 403


@dataclass(frozen=True, slots=True)
class Registration:
    """A valid registration, token still in plaintext (the caller seals it at once)."""

    tenant_id: str
    user_id: str
    device_id: str
    provider: str
    token: str
    bundle_env: str
    client_platform: str
    app_version: str
    locale: str
    timezone: str
    capabilities: tuple[str, ...]
    voip_token: str = ""
    """APNs only: the PushKit token a call's VoIP push goes to (13.5.2); required with the
    ``voip`` capability. FCM devices take the high-priority call message on ``token``."""


def _deny(detail: str, status: int = 403) -> Refusal:
    return Refusal("PERMISSION_DENIED", detail, status)


def _text(body: dict[str, Any], name: str, default: str = "") -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise _deny(f"bad_{name}", 400)
    return value


def validate_registration(
    body: dict[str, Any],
    *,
    tenant_id: str,
    user_id: str,
    token_device_id: str | None,
    connection_device_id: str | None,
) -> Registration:
    """The registration ``body`` of the verified caller (tenant, user), or :class:`Refusal`.

    ``token_device_id`` is the access token's device binding (None: any device of the user);
    ``connection_device_id`` the device of the caller's current AUTHed connection (None: it has
    none). 16.6: the request MUST carry the same device_id as the current connection, and may
    name only the caller's own tenant and user.
    """
    if body.get("tenant_id", tenant_id) != tenant_id:
        raise _deny("other_tenant")
    if body.get("user_id", user_id) != user_id:
        raise _deny("other_user")
    device_id = body.get("device_id")
    if not isinstance(device_id, str) or not _ID.fullmatch(device_id):
        raise _deny("bad_device_id", 400)
    if token_device_id is not None and device_id != token_device_id:
        raise _deny("other_device")
    if connection_device_id is None:
        raise _deny("not_authenticated_on_a_connection")
    if device_id != connection_device_id:
        raise _deny("other_device")
    provider = body.get("provider")
    if not isinstance(provider, str) or provider not in OFFERED_PROVIDERS:
        raise _deny("unknown_provider", 400)
    token = body.get("token")
    pattern = _APNS_TOKEN if provider == "APNS" else _FCM_TOKEN
    if not isinstance(token, str) or not pattern.fullmatch(token):
        raise _deny("malformed_token", 400)
    bundle_env = body.get("bundle_env", "production")
    if bundle_env not in BUNDLE_ENVS:
        raise _deny("bad_bundle_env", 400)
    capabilities = body.get("capabilities", [])
    if not isinstance(capabilities, list) or not all(
        isinstance(c, str) and c in _CAPABILITIES for c in capabilities
    ):
        raise _deny("bad_capabilities", 400)
    voip_token = body.get("voip_token", "")
    if voip_token != "" and (
        provider != "APNS"
        or not isinstance(voip_token, str)
        or not _APNS_TOKEN.fullmatch(voip_token)
    ):
        raise _deny("malformed_voip_token", 400)
    if provider == "APNS" and "voip" in capabilities and not voip_token:
        raise _deny("voip_token_required", 400)
    texts = {name: _text(body, name) for name in _TEXT_FIELDS}
    return Registration(
        tenant_id=tenant_id,
        user_id=user_id,
        device_id=device_id,
        provider=provider,
        token=token.lower() if provider == "APNS" else token,
        bundle_env=str(bundle_env),
        capabilities=tuple(sorted(set(capabilities))),
        voip_token=str(voip_token).lower(),
        **texts,
    )
