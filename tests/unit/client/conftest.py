"""Fixtures of the SDK tests: an in-memory network and a throwaway self-signed certificate."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qim.client import MemoryNetwork


@pytest.fixture
async def network() -> AsyncIterator[MemoryNetwork]:
    net = MemoryNetwork()
    yield net
    await net.close()


@dataclass(frozen=True)
class Cert:
    certfile: Path
    keyfile: Path


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Cert:
    """A P-256 self-signed certificate for localhost / 127.0.0.1 (openssl; no cryptography)."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "the TLS conformance tests need the openssl binary"
    base = tmp_path_factory.mktemp("tls")
    cert, key = base / "cert.pem", base / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return Cert(cert, key)
