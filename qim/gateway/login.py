"""Reading an AUTH frame (A.3 #1): shape checks, version refusal, the route token.

Kept apart from session.py so the state logic stays one screen per concern.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.gateway.ports import AuthRequest
from qim.schemas.frames import Auth, Error, ErrorCode, Frame

__all__ = ["MAX_DEVICE_ID_BYTES", "auth_request", "check_credentials", "upgrade_required"]

MAX_DEVICE_ID_BYTES: Final = 128


class _AuthRouteToken(msgspec.Struct):
    """A.3 gives AUTH no route_token field, yet §15.2.1 (3) makes a client that holds one
    present it on reconnect. We read an extra ``route_token`` key from the raw body (unknown
    keys are legal, §27.1.2). TODO(lead): add ``route_token: bytes = b""`` to ``Auth``."""

    route_token: bytes = b""


_ROUTE_TOKEN: Final = msgspec.msgpack.Decoder(_AuthRouteToken)


def check_credentials(auth: Auth) -> str:
    """Cheap shape checks before the authenticator is bothered; '' when fine."""
    if not auth.access_token:
        return "empty access_token"
    device = auth.device_id.encode("utf-8")
    if not device or len(device) > MAX_DEVICE_ID_BYTES or b"\x00" in device:
        return f"device_id must be 1..{MAX_DEVICE_ID_BYTES} octets without NUL"
    return ""


def route_token(raw_body: bytes) -> bytes:
    """The route token a redirected client presents, b'' when none (or not bytes)."""
    try:
        return _ROUTE_TOKEN.decode(raw_body).route_token
    except (msgspec.DecodeError, RecursionError):
        return b""


def auth_request(frame: Frame, auth: Auth, *, peer: str, version: int, now_ms: int) -> AuthRequest:
    """What the authenticator gets; the access token never goes to a log (§24.0 rule 4)."""
    return AuthRequest(
        access_token=auth.access_token,
        device_id=auth.device_id,
        client_version=auth.client_version,
        capabilities=auth.capabilities,
        now_ms=now_ms,
        peer=peer,
        route_token=route_token(frame.raw_body),
        protocol_version=version,
    )


def upgrade_required(client_version: int, server_versions: tuple[int, ...], rid: int) -> Error:
    """ERROR{UPGRADE_REQUIRED}: the AUTH header's Vc has no common version (§27.1.1)."""
    minimum = min(server_versions)
    return Error(
        code=int(ErrorCode.UPGRADE_REQUIRED),
        detail=f"frame version {client_version} unsupported; server speaks {minimum}+",
        request_id=rid,
        minimum_client_version=str(minimum),
    )
