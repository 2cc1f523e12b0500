"""The AUTH frame, including the route token a client presents after a REDIRECT.

A.3 #1 lists no ``route_token`` on AUTH, but §5.3.2 / §15.2.1 require the reconnect after a
REDIRECT to present it; :class:`~qim.schemas.frames.Auth` carries it as an optional field that is
omitted from the wire when empty.
"""

from __future__ import annotations

from qim.schemas.frames import (
    FRAMES_BY_NAME,
    PROTOCOL_VERSION,
    Auth,
    Frame,
    MailboxCursor,
    encode_body,
    frame_bytes,
)

__all__ = ["encode_auth", "route_token_of"]

_AUTH = FRAMES_BY_NAME["AUTH"]


def encode_auth(
    *,
    access_token: str,
    device_id: str,
    client_version: str,
    capabilities: int = 0,
    mailbox_cursor: MailboxCursor | None = None,
    route_token: bytes = b"",
    request_id: int = 0,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """One AUTH frame on the control stream; header version = the client's highest Vc."""
    body = Auth(
        access_token=access_token,
        device_id=device_id,
        client_version=client_version,
        capabilities=int(capabilities),
        mailbox_cursor=mailbox_cursor,
        route_token=route_token,
    )
    return frame_bytes(
        _AUTH.opcode,
        encode_body(body),
        request_id=request_id,
        stream_id=_AUTH.stream,
        version=version,
    )


def route_token_of(frame: Frame) -> bytes:
    """The route token an AUTH frame carries (b"" when none); for servers."""
    if not isinstance(frame.body, Auth):
        raise TypeError(f"{frame.name} is not AUTH")
    return frame.body.route_token
