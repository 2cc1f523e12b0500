"""URL schemes and the default dialer: a URL in, an open :class:`Transport` out.

==============================  ====================  ===========================================
URL                             transport             notes
==============================  ====================  ===========================================
``ws://host[:80]/path``         WebSocketTransport    plain, for local development and tests
``wss://host[:443]/path``       WebSocketTransport    browsers' path (§5.3.5), TLS via ``ssl``
``qim+tls://host[:443]``        TlsTransport          main path: TLS 1.3 + ALPN ``qim/1``
``memory://name``               MemoryTransport       only through ``MemoryNetwork.dial``
==============================  ====================  ===========================================

``qim+tls`` is the one spelling of the TLS/TCP scheme (``tls://`` is refused, so a URL never
means two things). A REDIRECT's ``endpoint_hint`` that holds a scheme (``wss://b.example``) is
dialed as given; a bare ``host:port`` keeps the current URL's scheme and path, so a client on
WSS stays on WSS after a redirect.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from qim.client.errors import TransportError
from qim.client.transport import TlsTransport, Transport, WebSocketTransport

__all__ = ["DEFAULT_PORTS", "Dialer", "Endpoint", "open_transport", "parse_url", "resolve_hint"]

Dialer = Callable[[str], Awaitable[Transport]]

DEFAULT_PORTS: Final[dict[str, int]] = {"ws": 80, "wss": 443, "qim+tls": 443}


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str = ""


def parse_url(url: str) -> Endpoint:
    """Split a ``ws``/``wss``/``qim+tls`` URL; raises TransportError for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TransportError(
            f"unsupported URL scheme {parts.scheme!r} in {url!r}; use ws, wss or qim+tls"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise TransportError(f"bad port in {url!r}: {exc}") from None
    if not parts.hostname:
        raise TransportError(f"no host in {url!r}")
    path = parts.path if not parts.query else f"{parts.path}?{parts.query}"
    return Endpoint(scheme, parts.hostname, port or DEFAULT_PORTS[scheme], path)


def resolve_hint(current_url: str, endpoint_hint: str) -> str:
    """The URL a REDIRECT sends us to (see the module docstring)."""
    if not endpoint_hint:
        raise TransportError("REDIRECT without endpoint_hint")
    if "://" in endpoint_hint:
        return endpoint_hint
    parts = urlsplit(current_url)
    return urlunsplit((parts.scheme, endpoint_hint, parts.path, parts.query, ""))


async def open_transport(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    open_timeout: float | None = 10.0,
) -> Transport:
    """Open the transport ``url``'s scheme names; TLS contexts default to verifying ones."""
    endpoint = parse_url(url)
    if endpoint.scheme == "qim+tls":
        return await TlsTransport.connect(
            endpoint.host,
            endpoint.port,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            open_timeout=open_timeout,
        )
    return await WebSocketTransport.connect(
        url,
        ssl_context=ssl_context,
        server_hostname=server_hostname,
        open_timeout=open_timeout,
    )
