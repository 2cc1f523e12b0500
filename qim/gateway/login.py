"""Reading an AUTH frame (A.3 #1): shape checks, version refusal, the route token.

Kept apart from session.py so the state logic stays one screen per concern.
"""

from __future__ import annotations

from typing import Final

from qim.gateway.ports import AuthRequest
from qim.schemas.frames import Auth, Error, ErrorCode, Frame

__all__ = ["MAX_DEVICE_ID_BYTES", "auth_request", "check_credentials", "upgrade_required"]

MAX_DEVICE_ID_BYTES: Final = 128


def check_credentials(auth: Auth) -> str:
    """Cheap shape checks before the authenticator is bothered; '' when fine."""
    if not auth.access_token:
        return "empty access_token"
    device = auth.device_id.encode("utf-8")
    if not device or len(device) > MAX_DEVICE_ID_BYTES or b"\x00" in device:
        return f"device_id must be 1..{MAX_DEVICE_ID_BYTES} octets without NUL"
    return ""


def auth_request(frame: Frame, auth: Auth, *, peer: str, version: int, now_ms: int) -> AuthRequest:
    """What the authenticator gets; the access token never goes to a log (§24.0 rule 4)."""
    return AuthRequest(
        access_token=auth.access_token,
        device_id=auth.device_id,
        client_version=auth.client_version,
        capabilities=auth.capabilities,
        now_ms=now_ms,
        peer=peer,
        route_token=auth.route_token,
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
