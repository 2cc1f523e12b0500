"""Run the group admin endpoint: a started :class:`GroupAdmin` behind the aiohttp app.

``qim admin serve`` calls :func:`serve_group_admin`; tests use :func:`start_group_admin_server`
with ``port=0``. Start order matters: the GroupAdmin resolves its reply position and checks the
partition count before the first HTTP request can be accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from qim.admin.groups import GroupAdmin
from qim.admin.http import make_group_admin_app
from qim.admin.wire import DEFAULT_GROUP_ADMIN_PORT

__all__ = [
    "GroupAdminServer",
    "serve_group_admin",
    "start_group_admin_server",
]


@dataclass(frozen=True, slots=True)
class GroupAdminServer:
    """A started endpoint; ``await server.close()`` stops the HTTP side and the GroupAdmin."""

    runner: web.AppRunner
    admin: GroupAdmin
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        try:
            await self.runner.cleanup()
        finally:
            await self.admin.stop()


async def start_group_admin_server(
    admin: GroupAdmin,
    admin_secret: str,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_GROUP_ADMIN_PORT,
) -> GroupAdminServer:
    """Start ``admin`` (Kafka) and then the HTTP app; ``port=0`` picks a free port."""
    app = make_group_admin_app(admin, admin_secret)  # checks the secret before any I/O
    await admin.start()
    runner = web.AppRunner(app)
    try:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        await admin.stop()
        raise
    bound = port
    if runner.addresses:
        bound = int(runner.addresses[0][1])
    return GroupAdminServer(runner, admin, host, bound)


async def serve_group_admin(
    admin: GroupAdmin,
    admin_secret: str,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_GROUP_ADMIN_PORT,
    ready: Callable[[GroupAdminServer], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until ``stop`` is set (or the task is cancelled)."""
    server = await start_group_admin_server(admin, admin_secret, host=host, port=port)
    try:
        if ready is not None:
            ready(server)
        await (stop or asyncio.Event()).wait()
    finally:
        await server.close()
