"""Push providers behind one interface: a real APNs HTTP/2 client and a real FCM HTTP v1 client.

Neither service is reachable from the development machines, so the endpoints are configuration
(``QIM_APNS_PRODUCTION_URL`` / ``QIM_APNS_SANDBOX_URL`` / ``QIM_FCM_URL`` and the FCM service
account's ``token_uri``); the local stack points them at the stand-ins of
``qim.devstack.push_standins``, which speak the same wire protocols.

**APNs** (provider API, token-based auth): HTTP/2 ``POST /3/device/<token>`` with
``authorization: bearer <JWT>``: an ES256 JWT signed with the team's .p8 key, header ``kid`` =
key id, claims ``iss`` = team id and ``iat``; refreshed every 40 minutes (Apple refuses one
older than an hour and throttles refreshes more often than every 20). Headers ``apns-topic``
(the bundle id), ``apns-push-type`` (``alert`` or ``background`` for a silent badge update),
``apns-priority`` (10 / 5), ``apns-collapse-id`` (16.2.3) and ``apns-expiration``; a call's
VoIP push (13.5.2) is ``apns-push-type: voip``, priority 10, to the PushKit token on the
``<topic>.voip`` topic. A device
registered with ``bundle_env=sandbox`` goes to the sandbox endpoint, production to production
(16.6: mixing them fails every delivery). Errors are ``{"reason": ...}``.

**FCM** (HTTP v1): ``POST /v1/projects/<project>/messages:send`` with an OAuth2 bearer token
from the service account (the JWT-bearer grant: an RS256 assertion with ``iss`` = client email,
``scope`` = firebase.messaging, ``aud`` = token_uri, exchanged at ``token_uri``), cached until a
minute before it expires and fetched again once after a 401. ``android.collapse_key`` and
``android.notification.notification_count`` carry the collapse id and the badge; a silent
update is a data-only message. Errors are ``{"error": {"status", "details": [{"errorCode"}]}}``.

A timeout or connection failure is ``status=None`` (retried like a 5xx by the caller).
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import httpx
import jwt

__all__ = [
    "ApnsConfig",
    "ApnsProvider",
    "FcmConfig",
    "FcmProvider",
    "Notification",
    "ProviderResult",
    "PushProvider",
]

_TIMEOUT: Final = httpx.Timeout(10.0, connect=5.0)
APNS_JWT_REFRESH_S: Final = 40 * 60
FCM_SCOPE: Final = "https://www.googleapis.com/auth/firebase.messaging"


@dataclass(frozen=True, slots=True)
class Notification:
    """One push, provider-neutral. ``silent``: badge only, no alert (16.3 / 16.5)."""

    silent: bool
    title: str
    body: str
    badge: int
    collapse_id: str
    custom: Mapping[str, str | int] = field(default_factory=dict)
    thread_id: str = ""
    data_only: bool = False
    """16.7 / 22.4 item 4: an E2EE alert goes to Android as a data-only message (the client
    builds the notification after decrypting); APNs keeps the placeholder alert with
    ``mutable-content`` (item 3), which every alert already has."""
    voip: bool = False
    """An incoming call (13.5.2): APNs ``apns-push-type: voip`` at priority 10 on the
    ``<topic>.voip`` topic (PushKit), FCM a high-priority data-only message; no badge, no
    alert, the call's fields only."""


@dataclass(frozen=True, slots=True)
class ProviderResult:
    """The provider's answer: HTTP status (None: timeout / no connection) and its reason."""

    status: int | None
    reason: str = ""
    message_id: str = ""


class PushProvider(Protocol):
    name: str

    async def send(self, token: str, bundle_env: str, note: Notification) -> ProviderResult: ...

    async def aclose(self) -> None: ...


def _client_ssl(ca_file: str) -> ssl.SSLContext | bool:
    if not ca_file:
        return True
    return ssl.create_default_context(cafile=ca_file)


@dataclass(frozen=True)
class ApnsConfig:
    team_id: str
    key_id: str
    private_key_pem: str
    topic: str
    production_url: str = "https://api.push.apple.com"
    sandbox_url: str = "https://api.sandbox.push.apple.com"
    ca_file: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ApnsConfig | None:
        key_file = env.get("QIM_APNS_KEY_FILE", "")
        if not key_file:
            return None
        return cls(
            team_id=env["QIM_APNS_TEAM_ID"],
            key_id=env["QIM_APNS_KEY_ID"],
            private_key_pem=Path(key_file).read_text(),
            topic=env["QIM_APNS_TOPIC"],
            production_url=env.get("QIM_APNS_PRODUCTION_URL", cls.production_url),
            sandbox_url=env.get("QIM_APNS_SANDBOX_URL", cls.sandbox_url),
            ca_file=env.get("QIM_APNS_CA_FILE", ""),
        )


class ApnsProvider:
    """APNs over one HTTP/2 connection per endpoint (httpx with h2 multiplexes the streams)."""

    name = "APNS"

    def __init__(self, config: ApnsConfig, *, clock: Any = time.time) -> None:
        self.config = config
        self._clock = clock
        self._jwt = ""
        self._jwt_at = 0.0
        self._client = httpx.AsyncClient(
            http2=True, http1=False, timeout=_TIMEOUT, verify=_client_ssl(config.ca_file)
        )

    def bearer(self) -> str:
        now = self._clock()
        if not self._jwt or now - self._jwt_at >= APNS_JWT_REFRESH_S:
            self._jwt = jwt.encode(
                {"iss": self.config.team_id, "iat": int(now)},
                self.config.private_key_pem,
                algorithm="ES256",
                headers={"kid": self.config.key_id},
            )
            self._jwt_at = now
        return self._jwt

    def payload(self, note: Notification) -> dict[str, Any]:
        if note.voip:  # PushKit hands the whole dictionary to the app; no badge, no alert
            return {"aps": {}, **dict(note.custom)}
        aps: dict[str, Any] = {"badge": note.badge}
        if note.silent:
            aps["content-available"] = 1
        else:
            aps["alert"] = {"title": note.title, "body": note.body}
            aps["sound"] = "default"
            aps["mutable-content"] = 1
            if note.thread_id:
                aps["thread-id"] = note.thread_id
        return {"aps": aps, **dict(note.custom)}

    async def send(self, token: str, bundle_env: str, note: Notification) -> ProviderResult:
        base = self.config.sandbox_url if bundle_env == "sandbox" else self.config.production_url
        push_type = "voip" if note.voip else "background" if note.silent else "alert"
        headers = {
            "authorization": f"bearer {self.bearer()}",
            "apns-topic": f"{self.config.topic}.voip" if note.voip else self.config.topic,
            "apns-push-type": push_type,
            "apns-priority": "5" if note.silent and not note.voip else "10",
            "apns-expiration": "0",  # a call (or a badge) later than now is worth nothing
        }
        if note.collapse_id:
            headers["apns-collapse-id"] = note.collapse_id
        body = json.dumps(self.payload(note), separators=(",", ":")).encode()
        try:
            url = f"{base}/3/device/{token}"
            resp = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return ProviderResult(None, type(exc).__name__)
        reason = ""
        if resp.status_code != 200:
            try:
                reason = str(resp.json().get("reason", ""))
            except ValueError:
                reason = ""
        return ProviderResult(resp.status_code, reason, resp.headers.get("apns-id", ""))

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True)
class FcmConfig:
    project_id: str
    client_email: str
    private_key_pem: str
    token_uri: str
    url: str = "https://fcm.googleapis.com"
    ca_file: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FcmConfig | None:
        path = env.get("QIM_FCM_SERVICE_ACCOUNT_FILE", "")
        if not path:
            return None
        account = json.loads(Path(path).read_text())
        return cls(
            project_id=account["project_id"],
            client_email=account["client_email"],
            private_key_pem=account["private_key"],
            token_uri=account["token_uri"],
            url=env.get("QIM_FCM_URL", cls.url),
            ca_file=env.get("QIM_FCM_CA_FILE", ""),
        )


class FcmProvider:
    """FCM HTTP v1 with the service account's OAuth2 access token."""

    name = "FCM"

    def __init__(self, config: FcmConfig, *, clock: Any = time.time) -> None:
        self.config = config
        self._clock = clock
        self._access_token = ""
        self._expires_at = 0.0
        self._client = httpx.AsyncClient(timeout=_TIMEOUT, verify=_client_ssl(config.ca_file))

    def assertion(self) -> str:
        now = int(self._clock())
        return jwt.encode(
            {
                "iss": self.config.client_email,
                "scope": FCM_SCOPE,
                "aud": self.config.token_uri,
                "iat": now,
                "exp": now + 3600,
            },
            self.config.private_key_pem,
            algorithm="RS256",
        )

    async def access_token(self, *, force: bool = False) -> str:
        if force or not self._access_token or self._clock() >= self._expires_at - 60:
            resp = await self._client.post(
                self.config.token_uri,
                data={
                    "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                    "assertion": self.assertion(),
                },
            )
            resp.raise_for_status()
            answer = resp.json()
            self._access_token = str(answer["access_token"])
            self._expires_at = self._clock() + float(answer.get("expires_in", 3600))
        return self._access_token

    def message(self, token: str, note: Notification) -> dict[str, Any]:
        data = {k: str(v) for k, v in note.custom.items()}
        if note.voip:  # a call: high priority, data only (the app shows its call screen)
            return {"message": {"token": token, "data": data, "android": {"priority": "high"}}}
        data["badge"] = str(note.badge)
        android: dict[str, Any] = {"priority": "normal" if note.silent else "high"}
        if note.collapse_id:
            android["collapse_key"] = note.collapse_id
        msg: dict[str, Any] = {"token": token, "data": data, "android": android}
        if note.data_only and not note.silent:
            data["title"], data["body"] = note.title, note.body  # the placeholder, for fallback
        elif not note.silent:
            msg["notification"] = {"title": note.title, "body": note.body}
            android["notification"] = {"notification_count": note.badge}
        return {"message": msg}

    async def send(self, token: str, bundle_env: str, note: Notification) -> ProviderResult:
        url = f"{self.config.url}/v1/projects/{self.config.project_id}/messages:send"
        body = self.message(token, note)
        try:
            for attempt in range(2):
                bearer = await self.access_token(force=attempt > 0)
                resp = await self._client.post(
                    url, json=body, headers={"authorization": f"Bearer {bearer}"}
                )
                if resp.status_code != 401:
                    break
        except httpx.HTTPError as exc:
            return ProviderResult(None, type(exc).__name__)
        if resp.status_code == 200:
            return ProviderResult(200, "", str(resp.json().get("name", "")))
        return ProviderResult(resp.status_code, _fcm_reason(resp))

    async def aclose(self) -> None:
        await self._client.aclose()


def _fcm_reason(resp: httpx.Response) -> str:
    """The FcmError ``errorCode`` (UNREGISTERED, INVALID_ARGUMENT, ...), else the status name."""
    try:
        error = resp.json().get("error", {})
    except ValueError:
        return ""
    for detail in error.get("details", ()):
        if isinstance(detail, dict) and detail.get("errorCode"):
            return str(detail["errorCode"])
    return str(error.get("status", ""))
