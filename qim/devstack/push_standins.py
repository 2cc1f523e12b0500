"""Local stand-ins for APNs and FCM that speak their wire protocols (issue 17, spec 16).

Neither push service is reachable from these machines, so the test suite and the local stack
run these instead; the NotificationService's clients are the real ones, pointed here by
configuration.

* **APNs**: HTTP/2 over TLS (ALPN ``h2``, a self-signed certificate made at first start; the
  client trusts it through ``QIM_APNS_CA_FILE``), two listeners (production and sandbox).
  ``POST /3/device/<token>`` must carry a valid ES256 provider JWT (verified against the public
  half of the development .p8 key, ``kid`` and ``iss`` checked) and an ``apns-topic``;
  ``apns-push-type`` must be ``alert``, ``background`` or ``voip``, and a ``voip`` push must
  name the app's ``<bundle id>.voip`` topic (the others the bundle id). Answers as Apple
  does: 200 with ``apns-id``, else ``{"reason": ...}`` (403 InvalidProviderToken, 400
  BadDeviceToken, 410 Unregistered, 429 TooManyRequests, 5xx InternalServerError /
  ServiceUnavailable).
* **FCM**: HTTP/1.1 ``POST /v1/projects/<project>/messages:send`` with a bearer token that the
  stand-in's OAuth endpoint ``POST /token`` issued for a valid RS256 JWT-bearer assertion of
  the development service account. Errors in the v1 shape with an ``FcmError`` detail.
* **Control** (same port as FCM): ``POST /control/plan`` ``{"provider", "token", "answers":
  [status, ...]}`` queues answers for one token (then 200 again); ``GET /control/received``
  lists every request each stand-in got (headers, JSON body, which endpoint, the answer,
  ``received_at_ms`` on the host's wall clock: ``qim bench push`` measures wake-up latency
  from the message's commit to it);
  ``POST /control/reset`` clears both.

Run by ``qim push-standins`` (the stack starts it) or in-process by the tests.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import secrets
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jwt
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, DataReceived, RequestReceived, StreamEnded

__all__ = ["DevPushCredentials", "StandinState", "ensure_dev_credentials", "serve"]

APNS_TEAM_ID: Final = "QIMDEVTEAM"
APNS_KEY_ID: Final = "QIMDEVKEY1"
APNS_TOPIC: Final = "im.qim.dev"
FCM_PROJECT: Final = "qim-dev"
FCM_CLIENT_EMAIL: Final = "notify@qim-dev.iam.gserviceaccount.com"
_REASONS: Final = {
    400: "BadDeviceToken",
    403: "InvalidProviderToken",
    410: "Unregistered",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailable",
}
_FCM_ERRORS: Final = {
    400: ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    404: ("NOT_FOUND", "UNREGISTERED"),
    410: ("NOT_FOUND", "UNREGISTERED"),
    429: ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
    500: ("INTERNAL", "INTERNAL"),
    503: ("UNAVAILABLE", "UNAVAILABLE"),
}


@dataclass(frozen=True)
class DevPushCredentials:
    """Files of the development push credentials (made once under ``<base>/push``)."""

    base: Path

    @property
    def apns_key(self) -> Path:
        return self.base / "apns-auth-key.p8"

    @property
    def fcm_account(self) -> Path:
        return self.base / "fcm-service-account.json"

    @property
    def tls_cert(self) -> Path:
        return self.base / "standin-cert.pem"

    @property
    def tls_key(self) -> Path:
        return self.base / "standin-key.pem"

    def env(self, *, apns_port: int, apns_sandbox_port: int, fcm_port: int) -> dict[str, str]:
        """What the NotificationService needs to reach the stand-ins."""
        return {
            "QIM_APNS_KEY_FILE": str(self.apns_key),
            "QIM_APNS_TEAM_ID": APNS_TEAM_ID,
            "QIM_APNS_KEY_ID": APNS_KEY_ID,
            "QIM_APNS_TOPIC": APNS_TOPIC,
            "QIM_APNS_PRODUCTION_URL": f"https://127.0.0.1:{apns_port}",
            "QIM_APNS_SANDBOX_URL": f"https://127.0.0.1:{apns_sandbox_port}",
            "QIM_APNS_CA_FILE": str(self.tls_cert),
            "QIM_FCM_SERVICE_ACCOUNT_FILE": str(self.fcm_account),
            "QIM_FCM_URL": f"http://127.0.0.1:{fcm_port}",
        }


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    tmp.replace(path)


def ensure_dev_credentials(base: Path, *, fcm_port: int) -> DevPushCredentials:
    """Make the development .p8 key, the FCM service account (its ``token_uri`` at the
    stand-in) and the stand-ins' TLS certificate, unless they exist."""
    creds = DevPushCredentials(base)
    base.mkdir(parents=True, exist_ok=True)
    if not creds.apns_key.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(creds.apns_key, pem)
    account = json.loads(creds.fcm_account.read_text()) if creds.fcm_account.exists() else None
    token_uri = f"http://127.0.0.1:{fcm_port}/token"
    if account is None or account.get("token_uri") != token_uri:
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem_text = rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        account = {
            "type": "service_account",
            "project_id": FCM_PROJECT,
            "private_key_id": "dev1",
            "private_key": pem_text,
            "client_email": FCM_CLIENT_EMAIL,
            "token_uri": token_uri,
        }
        _write_private(creds.fcm_account, json.dumps(account, indent=1).encode())
    if not creds.tls_cert.exists():
        tls_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "qim push stand-in")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(tls_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(tls_key, hashes.SHA256())
        )
        _write_private(
            creds.tls_key,
            tls_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        _write_private(creds.tls_cert, cert.public_bytes(serialization.Encoding.PEM))
    return creds


@dataclass
class StandinState:
    """What both stand-ins received and the answers queued per (provider, token)."""

    creds: DevPushCredentials
    received: list[dict[str, Any]] = field(default_factory=list)
    plans: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    access_tokens: set[str] = field(default_factory=set)

    def answer(self, provider: str, token: str) -> int:
        queue = self.plans.get((provider, token))
        return queue.pop(0) if queue else 200

    def apns_public_key(self) -> Any:
        private = serialization.load_pem_private_key(self.creds.apns_key.read_bytes(), None)
        return private.public_key()

    def fcm_public_key(self) -> Any:
        account = json.loads(self.creds.fcm_account.read_text())
        private = serialization.load_pem_private_key(account["private_key"].encode(), None)
        return private.public_key()


class _ApnsProtocol(asyncio.Protocol):
    """One HTTP/2 connection to the APNs stand-in (h2, server side)."""

    def __init__(self, state: StandinState, endpoint: str) -> None:
        self.state = state
        self.endpoint = endpoint
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, tuple[dict[str, str], bytearray]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        try:
            events = self.conn.receive_data(data)
        except Exception:
            self.transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived):
                headers = {str(k): str(v) for k, v in event.headers}
                self.streams[event.stream_id] = (headers, bytearray())
            elif isinstance(event, DataReceived):
                if event.stream_id in self.streams:
                    self.streams[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamEnded):
                self._respond(event.stream_id)
            elif isinstance(event, ConnectionTerminated):
                self.transport.close()
        self.transport.write(self.conn.data_to_send())

    def _verify(self, headers: dict[str, str]) -> str:
        """'' if the provider token is valid, else the APNs reason."""
        auth = headers.get("authorization", "")
        if not auth.startswith("bearer "):
            return "MissingProviderToken"
        raw = auth.removeprefix("bearer ")
        try:
            if jwt.get_unverified_header(raw).get("kid") != APNS_KEY_ID:
                return "InvalidProviderToken"
            claims = jwt.decode(raw, self.state.apns_public_key(), algorithms=["ES256"])
        except jwt.PyJWTError:
            return "InvalidProviderToken"
        if claims.get("iss") != APNS_TEAM_ID or "iat" not in claims:
            return "InvalidProviderToken"
        return ""

    def _respond(self, stream_id: int) -> None:
        headers, body = self.streams.pop(stream_id, ({}, bytearray()))
        path = headers.get(":path", "")
        token = path.removeprefix("/3/device/") if path.startswith("/3/device/") else ""
        status, reason = 200, ""
        if headers.get(":method") != "POST" or not token:
            status, reason = 404, "BadPath"
        elif problem := self._verify(headers):
            status, reason = 403, problem
        elif headers.get("apns-push-type") not in {"alert", "background", "voip"}:
            status, reason = 400, "InvalidPushType"
        elif headers.get("apns-topic") != (
            f"{APNS_TOPIC}.voip" if headers.get("apns-push-type") == "voip" else APNS_TOPIC
        ):  # as Apple: a VoIP push goes to the app's ".voip" topic, everything else to its id
            status, reason = (
                400,
                "DeviceTokenNotForTopic" if headers.get("apns-topic") else ("MissingTopic"),
            )
        else:
            status = self.state.answer("APNS", token)
            reason = _REASONS.get(status, "") if status != 200 else ""
        try:
            payload: Any = json.loads(bytes(body) or b"null")
        except ValueError:
            payload = None
        apns_id = secrets.token_hex(16)
        self.state.received.append(
            {
                "provider": "APNS",
                "endpoint": self.endpoint,
                "token": token,
                "headers": {k: v for k, v in headers.items() if k != "authorization"},
                "payload": payload,
                "status": status,
                "reason": reason,
                "received_at_ms": time.time_ns() // 1_000_000,
            }
        )
        out_headers = [(":status", str(status)), ("apns-id", apns_id)]
        data = b"" if status == 200 else json.dumps({"reason": reason}).encode()
        if data:
            out_headers.append(("content-type", "application/json"))
        self.conn.send_headers(stream_id, out_headers, end_stream=not data)
        if data:
            self.conn.send_data(stream_id, data, end_stream=True)


def _fcm_error(status: int, code: str) -> web.Response:
    grpc_status, error_code = _FCM_ERRORS.get(status, ("UNKNOWN", code))
    body = {
        "error": {
            "code": status,
            "message": error_code,
            "status": grpc_status,
            "details": [
                {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                 "errorCode": code or error_code}
            ],
        }
    }  # fmt: skip
    return web.json_response(body, status=status)


def _fcm_app(state: StandinState) -> web.Application:
    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        try:
            claims = jwt.decode(
                str(form.get("assertion", "")),
                state.fcm_public_key(),
                algorithms=["RS256"],
                audience=str(request.url.with_query(None)),
            )
        except jwt.PyJWTError as exc:
            return web.json_response({"error": "invalid_grant", "detail": str(exc)}, status=400)
        if claims.get("iss") != FCM_CLIENT_EMAIL or "firebase.messaging" not in str(
            claims.get("scope")
        ):
            return web.json_response({"error": "invalid_scope"}, status=400)
        access = f"ya29.dev-{secrets.token_urlsafe(24)}"
        state.access_tokens.add(access)
        return web.json_response(
            {"access_token": access, "expires_in": 3599, "token_type": "Bearer"}
        )

    async def send(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in state.access_tokens:
            return web.json_response(
                {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "bad token"}},
                status=401,
            )
        if request.match_info["project"] != FCM_PROJECT:
            return _fcm_error(403, "SENDER_ID_MISMATCH")
        try:
            body = await request.json()
            message = body["message"]
            device_token = str(message["token"])
        except (ValueError, KeyError, TypeError):
            return _fcm_error(400, "INVALID_ARGUMENT")
        status = state.answer("FCM", device_token)
        state.received.append(
            {
                "provider": "FCM",
                "endpoint": "fcm",
                "token": device_token,
                "headers": {},
                "payload": body,
                "status": status,
                "reason": "",
                "received_at_ms": time.time_ns() // 1_000_000,
            }
        )
        if status == 200:
            name = f"projects/{FCM_PROJECT}/messages/{secrets.token_hex(8)}"
            return web.json_response({"name": name})
        return _fcm_error(status, "")

    async def plan(request: web.Request) -> web.Response:
        body = await request.json()
        key = (str(body["provider"]), str(body["token"]))
        state.plans.setdefault(key, []).extend(int(a) for a in body["answers"])
        return web.json_response({"queued": len(state.plans[key])})

    async def received(request: web.Request) -> web.Response:
        return web.json_response({"received": state.received})

    async def reset(request: web.Request) -> web.Response:
        state.received.clear()
        state.plans.clear()
        return web.json_response({"reset": True})

    app = web.Application()
    app.router.add_post("/token", token)
    app.router.add_post("/v1/projects/{project}/messages:send", send)
    app.router.add_post("/control/plan", plan)
    app.router.add_get("/control/received", received)
    app.router.add_post("/control/reset", reset)
    return app


def _tls(creds: DevPushCredentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(creds.tls_cert, creds.tls_key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


async def serve(
    base: Path, *, apns_port: int, apns_sandbox_port: int, fcm_port: int
) -> tuple[StandinState, list[Any]]:
    """Start both stand-ins on 127.0.0.1; returns the state and what to close."""
    creds = ensure_dev_credentials(base, fcm_port=fcm_port)
    state = StandinState(creds)
    loop = asyncio.get_running_loop()
    closers: list[Any] = []
    for port, endpoint in ((apns_port, "production"), (apns_sandbox_port, "sandbox")):

        def factory(e: str = endpoint) -> asyncio.Protocol:
            return _ApnsProtocol(state, e)

        server = await loop.create_server(factory, "127.0.0.1", port, ssl=_tls(creds))
        closers.append(server)
    runner = web.AppRunner(_fcm_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", fcm_port).start()
    closers.append(runner)
    return state, closers


async def run_forever(base: Path, *, apns_port: int, apns_sandbox_port: int, fcm_port: int) -> None:
    _, closers = await serve(
        base, apns_port=apns_port, apns_sandbox_port=apns_sandbox_port, fcm_port=fcm_port
    )
    try:
        await asyncio.Event().wait()
    finally:
        for c in closers:
            if isinstance(c, web.AppRunner):
                await c.cleanup()
            else:
                c.close()
