"""The writer's self-fence: stop writing once the group lease may have lapsed (spec 19.2.2).

The lease of a ConversationWriter partition is its consumer-group membership; the session
timeout is ``shard_lease_ttl``. A member that cannot heartbeat (a partition from the
coordinator, a stop-the-world pause) is evicted after the session timeout and its partitions go
to another member. Fencing of what it writes after that is Kafka's (the new owner's
InitProducerId fences its transactional producer); the self-fence narrows the window further,
as the spec requires: when no heartbeat has succeeded for ``writer_self_fence_deadline`` (less
than the session timeout), the writer commits nothing until heartbeats are back or the group
has reassigned it.

How: aiokafka exposes no heartbeat callback, so :func:`install` wraps the coordinator's private
``_do_heartbeat`` coroutine (aiokafka 0.14), timing each success at its send. If the hook is
missing the lease reports valid and only Kafka's fencing applies (logged once).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HeartbeatLease"]

log = logging.getLogger(__name__)


class HeartbeatLease:
    """Valid while the last successful heartbeat (or assignment) is younger than the deadline."""

    def __init__(self, deadline_ms: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if deadline_ms <= 0:
            raise ValueError("deadline_ms must be positive")
        self.deadline_s = deadline_ms / 1000
        self._clock = clock
        self._renewed_at = clock()
        self.enforced = False
        self.lapses = 0
        self._lapsed = False
        self._renewed = asyncio.Event()

    def renew(self, at: float | None = None) -> None:
        """A heartbeat sent at ``at`` succeeded, or the group just assigned partitions."""
        at = self._clock() if at is None else at
        self._renewed_at = max(self._renewed_at, at)
        self._lapsed = False
        self._renewed.set()

    def valid(self) -> bool:
        if not self.enforced:
            return True
        ok = self._clock() - self._renewed_at < self.deadline_s
        if not ok and not self._lapsed:
            self._lapsed = True
            self.lapses += 1
            log.warning("writer lease lapsed: no heartbeat for %.1f s", self.deadline_s)
        return ok

    async def wait_valid(self) -> None:
        """Return once the lease is valid (a heartbeat succeeded or the group assigned)."""
        while not self.valid():
            self._renewed.clear()
            await self._renewed.wait()

    def install(self, consumer: Any) -> bool:
        """Renew on every successful heartbeat of ``consumer`` (after its ``start()``)."""
        coordinator: Any = getattr(consumer, "_coordinator", None)
        original = getattr(coordinator, "_do_heartbeat", None)
        if original is None or not inspect.iscoroutinefunction(original):
            log.warning("aiokafka heartbeat hook not found: the writer self-fence is off")
            return False

        async def probed_heartbeat() -> bool:
            sent_at = self._clock()
            ok = bool(await original())
            if ok:
                self.renew(sent_at)
            return ok

        coordinator._do_heartbeat = probed_heartbeat
        self.enforced = True
        return True
