"""URL schemes and REDIRECT endpoint resolution."""

from __future__ import annotations

import pytest

from qim.client import Endpoint, TransportError, parse_url, resolve_hint


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("ws://127.0.0.1:8080/im", Endpoint("ws", "127.0.0.1", 8080, "/im")),
        ("wss://im.example.com", Endpoint("wss", "im.example.com", 443, "")),
        ("qim+tls://im.example.com", Endpoint("qim+tls", "im.example.com", 443, "")),
        ("QIM+TLS://[::1]:9443", Endpoint("qim+tls", "::1", 9443, "")),
    ],
)
def test_supported_schemes(url: str, endpoint: Endpoint) -> None:
    assert parse_url(url) == endpoint


@pytest.mark.parametrize("url", ["tls://h:1", "http://h", "memory://a", "ws://", "ws://h:x"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(TransportError):
        parse_url(url)


def test_bare_hint_keeps_scheme_and_path() -> None:
    assert resolve_hint("wss://a.example:443/im", "b.example:8443") == "wss://b.example:8443/im"
    assert resolve_hint("qim+tls://a:1", "b:2") == "qim+tls://b:2"


def test_hint_with_scheme_is_dialed_as_given() -> None:
    assert resolve_hint("wss://a/im", "qim+tls://b:443") == "qim+tls://b:443"


def test_empty_hint_is_refused() -> None:
    with pytest.raises(TransportError):
        resolve_hint("ws://a", "")
