"""TLS contexts of the listeners (§5.3.5, §20.1): TLS 1.3 only, ALPN ``qim/1`` or ``http/1.1``.

ALPN tells transports apart, never versions (§27.1.1 layer 1): the TCP listener speaks the
custom frames and requires ``qim/1``; the WebSocket listener offers ``http/1.1`` for the
upgrade. Python's ssl module never accepts 0-RTT early data, so §5.3.6's "0-RTT off" holds.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

__all__ = ["ALPN_HTTP", "ALPN_QIM", "server_context"]

ALPN_QIM: Final = "qim/1"
ALPN_HTTP: Final = "http/1.1"


def server_context(certfile: Path, keyfile: Path, alpn: list[str]) -> ssl.SSLContext:
    """A server context with the certificate chain, TLS >= 1.3 and the ALPN list."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(certfile), str(keyfile))
    ctx.set_alpn_protocols(alpn)
    return ctx
