"""Bytes on the wire of SDK connections: a Transport wrapper the client dials through.

Used by the login scenario ("bytes" per login) through the SDK's own ``dial=`` hook, so the
client code under measurement is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from qim.client import Dialer, Transport, open_transport

__all__ = ["ByteCounter", "CountingTransport", "counting_dial"]


@dataclass
class ByteCounter:
    sent: int = 0
    received: int = 0


class CountingTransport:
    """Passes everything through to ``inner`` and adds the sizes to ``counter``."""

    def __init__(self, inner: Transport, counter: ByteCounter) -> None:
        self._inner = inner
        self._counter = counter

    @property
    def message_framed(self) -> bool:
        return self._inner.message_framed

    async def send(self, data: bytes) -> None:
        self._counter.sent += len(data)
        await self._inner.send(data)

    async def recv(self) -> bytes:
        data = await self._inner.recv()
        self._counter.received += len(data)
        return data

    async def close(self) -> None:
        await self._inner.close()


def counting_dial(counter: ByteCounter) -> Dialer:
    async def dial(url: str) -> Transport:
        return CountingTransport(await open_transport(url), counter)

    return dial
