"""The AUTH frame, including the route token a client presents after a REDIRECT.

Gap in the frame models: A.3 #1 lists ``AUTH{access_token, device_id, client_version,
capabilities, mailbox_cursor}`` and :class:`~qim.schemas.frames.Auth` has exactly those, but
§5.3.2 / §15.2.1 require the reconnect after a REDIRECT (and any fast reconnect holding an
unexpired token) to *present* the ``route_token``. Until ``Auth`` gains the field, the SDK sends
it as one extra key of the AUTH body map, ``route_token`` (bin). That is what §27.1.2 already
allows: a decoder that does not know the key skips it, and a server that does reads it from the
frame's ``raw_body`` with :func:`route_token_of`. When ``Auth`` grows a ``route_token: bytes``
field this subclass keeps the same wire bytes and can be deleted.
"""

from __future__ import annotations

import msgspec

from qim.schemas.frames import (
    FRAMES_BY_NAME,
    PROTOCOL_VERSION,
    Auth,
    Frame,
    MailboxCursor,
    encode_body,
    frame_bytes,
)

__all__ = ["AuthWithRouteToken", "encode_auth", "route_token_of"]

_AUTH = FRAMES_BY_NAME["AUTH"]


class AuthWithRouteToken(Auth):
    """AUTH plus ``route_token`` (empty = none, and then omitted from the wire)."""

    route_token: bytes = b""


_DECODER = msgspec.msgpack.Decoder(AuthWithRouteToken)


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
    body = AuthWithRouteToken(
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
    try:
        return _DECODER.decode(frame.raw_body).route_token
    except msgspec.DecodeError:
        return b""
