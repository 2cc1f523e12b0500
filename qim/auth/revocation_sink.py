"""The AuthService's ``revocation_sink`` on Kafka: each committed revocation becomes one
``qim.revocations`` record (acks=all), which every gateway reads to kick live sessions."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from qim.auth.service import Revocation
from qim.schemas.records.revocation import RevocationNotice, encode_revocation
from qim.streams.topics import REVOCATIONS

__all__ = ["KafkaRevocationSink", "notice_of"]


def notice_of(revocation: Revocation) -> RevocationNotice:
    return RevocationNotice(
        scope=revocation.scope,
        reason=revocation.reason,
        revoked_at=revocation.revoked_at_ms,
        tenant_id=revocation.tenant_id,
        user_id=revocation.user_id,
        device_id=revocation.device_id,
        token_id=revocation.token_id,
    )


class KafkaRevocationSink:
    """Usable as ``AuthService(revocation_sink=...)`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, bootstrap: str, topic: str = REVOCATIONS.name) -> None:
        self._topic = topic
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def __call__(self, revocation: Revocation) -> None:
        """Returns once the record is durable: the caller then reports the revocation done."""
        key = (revocation.token_id or f"{revocation.tenant_id}/{revocation.user_id}").encode()
        await self._producer.send_and_wait(
            self._topic, encode_revocation(notice_of(revocation)), key=key, partition=0
        )
