"""The device-token HTTP management API (16.6): register / overwrite / delete after AUTH.

``POST /v1/device-tokens`` with ``Authorization: Bearer <access_token>`` and a JSON body
``{device_id, session_epoch, provider, token, bundle_env?, client_platform?, app_version?,
locale?, timezone?, capabilities?, voip_token?, client_version?, request_id?}`` (``voip_token``:
an APNs device's PushKit token, required with the ``voip`` capability, 13.5.2); ``DELETE
/v1/device-tokens/<device_id>?session_epoch=..`` the same way.

"After AUTH, the same device_id as the current connection" (16.6) is checked, not trusted:
the access token is verified like a re-AUTH (signature, expiry, device binding, revocation,
``minimum_client_version``: :meth:`AuthService.reauthenticate`, nothing allocated), and the
``session_epoch`` the client got in AUTH_OK must be the device's current one in the
AuthService -- so only the device's latest AUTHed connection can register for it. Redis is
on this path, which is not the per-push path.

The token is sealed (``qim.agents.notify.sealing``) before anything is produced, then one
:class:`DeviceTokenCommand` goes to ``qim.device-token-commands`` (explicit partition = the
user's mailbox shard) and the answer ``200 {request_id, status: "accepted"}`` is sent once
Kafka acknowledged it (acks=all): the NotificationService applies commands in order per
device, and the ``device_token_digest`` record is the observable "stored". Refusals are
``{error: <A.6 code>, detail, request_id}`` and store nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from qim.agents.notify.sealing import TokenSealer, voip_aad
from qim.auth.errors import AuthError
from qim.auth.service import AuthService
from qim.core.notify.registration import Refusal, validate_registration
from qim.schemas.records.notify import (
    DeviceKey,
    DeviceTokenCommand,
    DeviceTokenDelete,
    encode,
)

__all__ = ["MAX_BODY_BYTES", "Produce", "RegistrationApi"]

MAX_BODY_BYTES: Final = 16 * 1024
Produce = Callable[[bytes, bytes, int], Awaitable[None]]
"""(key, value, partition) -> once Kafka acknowledged the record."""

_AUTH_STATUS: Final = {
    "PERMISSION_DENIED": 403,
    "TOKEN_EXPIRED": 401,
    "TOKEN_REVOKED": 401,
    "UPGRADE_REQUIRED": 426,
}


@dataclass(frozen=True, slots=True)
class _Bound:
    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: int


def _answer(code: int, request_id: str, **body: Any) -> tuple[int, dict[str, Any]]:
    return code, {"request_id": request_id, **body}


def _refused(request_id: str, code: str, detail: str, status: int) -> tuple[int, dict[str, Any]]:
    return _answer(status, request_id, error=code, detail=detail)


class RegistrationApi:
    """The API's logic, transport-free (the Faust app's web views call it)."""

    def __init__(
        self,
        auth: AuthService,
        sealer: TokenSealer,
        produce: Produce,
        *,
        partition_of: Callable[[DeviceKey], int],
        now_ms: Callable[[], int],
    ) -> None:
        self.auth = auth
        self.sealer = sealer
        self.produce = produce
        self.partition_of = partition_of
        self.now_ms = now_ms
        self.refusals: dict[str, int] = {}

    async def _caller(
        self, headers: Mapping[str, str], device_id: object, session_epoch: object, version: object
    ) -> tuple[str, str, str | None, str | None]:
        """(tenant, user, token's device binding, device of the caller's current connection)."""
        auth = headers.get("Authorization", headers.get("authorization", ""))
        if not auth.startswith("Bearer "):
            raise AuthError("PERMISSION_DENIED", detail="missing_token", reason="no_bearer")
        token = auth.removeprefix("Bearer ").strip()
        claims = self.auth.codec.verify_access(token, now_ms=self.now_ms())
        if not isinstance(device_id, str) or not device_id:
            return claims.tenant_id, claims.user_id, claims.device_id, None
        epoch = session_epoch if isinstance(session_epoch, int) else -1
        bound = _Bound(claims.tenant_id, claims.user_id, device_id, epoch)
        await self.auth.reauthenticate(
            token, device_id, version if isinstance(version, str) else "", bound=bound
        )
        try:
            current = await self.auth.current_session_epoch(
                claims.tenant_id, claims.user_id, device_id
            )
        except ValueError:
            return claims.tenant_id, claims.user_id, claims.device_id, None
        connected = device_id if current > 0 and current == epoch else None
        return claims.tenant_id, claims.user_id, claims.device_id, connected

    def _count(self, detail: str) -> None:
        self.refusals[detail] = self.refusals.get(detail, 0) + 1

    async def register(
        self, headers: Mapping[str, str], body: object
    ) -> tuple[int, dict[str, Any]]:
        request_id = secrets.token_hex(8)
        if not isinstance(body, dict):
            self._count("bad_body")
            return _refused(request_id, "PERMISSION_DENIED", "bad_body", 400)
        if isinstance(body.get("request_id"), str) and body["request_id"]:
            request_id = str(body["request_id"])[:64]
        try:
            tenant, user, token_device, connected = await self._caller(
                headers,
                body.get("device_id"),
                body.get("session_epoch"),
                body.get("client_version"),
            )
            reg = validate_registration(
                body,
                tenant_id=tenant,
                user_id=user,
                token_device_id=token_device,
                connection_device_id=connected,
            )
        except AuthError as err:
            self._count(err.detail)
            return _refused(request_id, err.code, err.detail, _AUTH_STATUS.get(err.code, 403))
        except Refusal as refusal:
            self._count(refusal.detail)
            return _refused(request_id, refusal.code, refusal.detail, refusal.status)
        key = DeviceKey(reg.tenant_id, reg.user_id, reg.device_id)
        command = DeviceTokenCommand(
            request_id=request_id,
            tenant_id=reg.tenant_id,
            user_id=reg.user_id,
            device_id=reg.device_id,
            provider=reg.provider,
            sealed_token=self.sealer.seal(reg.token, key.encode()),
            token_fingerprint=self.sealer.fingerprint(reg.token),
            bundle_env=reg.bundle_env,
            client_platform=reg.client_platform,
            app_version=reg.app_version,
            locale=reg.locale,
            timezone=reg.timezone,
            capabilities=reg.capabilities,
            sealed_voip_token=(
                self.sealer.seal(reg.voip_token, voip_aad(key)) if reg.voip_token else b""
            ),
            voip_token_fingerprint=(
                self.sealer.fingerprint(reg.voip_token) if reg.voip_token else ""
            ),
            at_ms=self.now_ms(),
        )
        await self.produce(key.encode(), encode(command), self.partition_of(key))
        return _answer(200, request_id, status="accepted", device_id=reg.device_id)

    async def delete(
        self, headers: Mapping[str, str], device_id: str, query: Mapping[str, str]
    ) -> tuple[int, dict[str, Any]]:
        request_id = secrets.token_hex(8)
        raw_epoch = query.get("session_epoch", "")
        epoch = int(raw_epoch) if raw_epoch.isdigit() else -1
        try:
            tenant, user, token_device, connected = await self._caller(
                headers, device_id, epoch, query.get("client_version", "")
            )
        except AuthError as err:
            self._count(err.detail)
            return _refused(request_id, err.code, err.detail, _AUTH_STATUS.get(err.code, 403))
        if (token_device is not None and token_device != device_id) or connected != device_id:
            self._count("other_device")
            return _refused(request_id, "PERMISSION_DENIED", "other_device", 403)
        key = DeviceKey(tenant, user, device_id)
        command = DeviceTokenDelete(
            request_id=request_id,
            tenant_id=tenant,
            user_id=user,
            device_id=device_id,
            reason="client",
            at_ms=self.now_ms(),
        )
        await self.produce(key.encode(), encode(command), self.partition_of(key))
        return _answer(200, request_id, status="accepted", device_id=device_id)
