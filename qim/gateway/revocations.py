"""Every gateway follows ``qim.revocations`` and kicks the live sessions a revocation ends.

Why Kafka and not a Redis call: the check on every frame would put Redis on the per-frame path
(design rule: Redis is for logins only). Instead the AuthService publishes each committed
revocation once (``qim.auth.revocation_sink``) and each ConnectionNode reads the one partition
from its end (sessions opened before the node started were checked against Redis at their
login). A hit sends ``KICKED{reason}`` and closes: nothing is served on that connection after
the record is read. The ``authz_recheck_interval`` Redis recheck stays the fallback for a node
that could not read the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from qim.schemas.records.revocation import RevocationNotice, decode_revocation

__all__ = ["RevocationFollower"]

log = logging.getLogger(__name__)


class RevocationFollower:
    """Reads ``topic`` partition 0 from its end and hands each notice to ``on_notice``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        on_notice: Callable[[RevocationNotice], None],
        on_malformed: Callable[[], None] = lambda: None,
    ) -> None:
        self._tp = TopicPartition(topic, 0)
        self._on_notice = on_notice
        self._on_malformed = on_malformed
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Returns once the end offset is fixed: every revocation published later is seen."""
        await self._consumer.start()
        self._consumer.assign([self._tp])
        try:
            await asyncio.wait_for(self._consumer.seek_to_end(self._tp), 30)
            await asyncio.wait_for(self._consumer.position(self._tp), 30)
        except TimeoutError:
            await self._consumer.stop()
            raise RuntimeError(f"{self._tp.topic} has no readable partition 0") from None
        self._task = asyncio.create_task(self._run(), name="revocations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def _run(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("qim.revocations fetch failed; retrying")
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    try:
                        notice = decode_revocation(record.value or b"")
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        self._on_malformed()
                        continue
                    self._on_notice(notice)
