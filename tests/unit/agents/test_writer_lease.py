"""The writer's self-fence (spec 19.2.2): no commit once heartbeats stopped for the deadline."""

from __future__ import annotations

import asyncio

from qim.agents.writer.lease import HeartbeatLease


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_unenforced_lease_is_always_valid() -> None:
    clock = Clock()
    lease = HeartbeatLease(4800, clock=clock)
    clock.now += 3600
    assert lease.valid()


def test_the_lease_lapses_after_the_deadline_and_heartbeats_renew_it() -> None:
    clock = Clock()
    lease = HeartbeatLease(4800, clock=clock)
    lease.enforced = True
    clock.now += 4.7
    assert lease.valid()
    clock.now += 0.2
    assert not lease.valid() and not lease.valid()
    assert lease.lapses == 1
    lease.renew(clock.now - 1)
    assert lease.valid()
    lease.renew(clock.now - 10)  # an older heartbeat never moves the lease back
    assert lease.valid()


async def test_wait_valid_returns_once_renewed() -> None:
    clock = Clock()
    lease = HeartbeatLease(1000, clock=clock)
    lease.enforced = True
    clock.now += 2
    waiter = asyncio.create_task(lease.wait_valid())
    await asyncio.sleep(0)
    assert not waiter.done()
    lease.renew()
    await asyncio.wait_for(waiter, 1)


def test_install_wraps_the_heartbeat_of_a_consumer() -> None:
    clock = Clock()
    lease = HeartbeatLease(1000, clock=clock)

    class Coordinator:
        async def _do_heartbeat(self) -> bool:
            return True

    class Consumer:
        _coordinator = Coordinator()

    consumer = Consumer()
    assert lease.install(consumer) and lease.enforced
    clock.now += 5
    assert not lease.valid()
    assert asyncio.run(consumer._coordinator._do_heartbeat())
    assert lease.valid()
    assert not HeartbeatLease(1000).install(object())
