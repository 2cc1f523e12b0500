"""The local stack's browser chat client and its development-only token endpoint.

`qim admin serve --dev-web-port N` (what `qim up` starts) serves, on 127.0.0.1 only:

* ``GET /`` and ``/app/*``: the chat client (``sdk/js/web``), ``/sdk/*`` the built TypeScript
  SDK (``sdk/js/dist``) and ``/vendor/msgpack/*`` its one dependency;
* ``GET /dev/config``: the tenant and the gateway URL the client connects to;
* ``POST /dev/token`` ``{"user_id", "device_id"}``: a signed access token for that user of the
  local tenant, so anyone can log in without writing code.

Why it cannot leak into a deployment: the app refuses to be built for a non-loopback bind
address, every request whose peer is not a loopback address gets 403, and the key ring must be
the development file (``load_keyring`` source ``dev-file``): with ``QIM_AUTH_KEYS`` set (a
production key ring) the endpoint is never mounted.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from qim.auth.config import AuthConfig, load_keyring
from qim.auth.tokens import TokenCodec

__all__ = ["DevWebConfig", "make_dev_web_app"]

ROOT: Final = Path(__file__).resolve().parents[2]
SDK_DIR: Final = ROOT / "sdk" / "js"
_ID: Final = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


@dataclass(frozen=True, slots=True)
class DevWebConfig:
    """What the browser client needs: the local tenant and the gateway it connects to."""

    tenant_id: str
    gateway_url: str
    host: str = "127.0.0.1"
    sdk_dir: Path = SDK_DIR


def _loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


@web.middleware
async def _loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not _loopback(request.remote):
        return web.json_response({"error": "forbidden", "detail": "loopback only"}, status=403)
    return await handler(request)


def make_dev_web_app(cfg: DevWebConfig) -> web.Application:
    """The app; raises ValueError outside the development stack (see the module docstring)."""
    if not _loopback(cfg.host):
        raise ValueError(f"the dev web endpoint binds loopback only, not {cfg.host!r}")
    keyring, source = load_keyring()
    if source != "dev-file":
        raise ValueError("the dev token endpoint needs the development key ring, not QIM_AUTH_KEYS")
    auth = AuthConfig.from_env()
    codec = TokenCodec(keyring, clock_skew_ms=auth.clock_skew_ms)
    web_dir, dist_dir = cfg.sdk_dir / "web", cfg.sdk_dir / "dist"
    msgpack_dir = cfg.sdk_dir / "node_modules" / "@msgpack" / "msgpack" / "dist.esm"

    async def index(_: web.Request) -> web.StreamResponse:
        if not (dist_dir / "index.js").exists() or not msgpack_dir.exists():
            text = (
                "the JS SDK is not built: scripts/bootstrap.sh (npm ci && npm run build in sdk/js)"
            )
            return web.Response(status=503, text=text)
        return web.FileResponse(web_dir / "index.html", headers={"Cache-Control": "no-store"})

    async def config(_: web.Request) -> web.Response:
        return web.json_response({"tenant_id": cfg.tenant_id, "gateway_url": cfg.gateway_url})

    async def token(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response({"error": "bad_request", "detail": "JSON object"}, status=400)
        user, device = body.get("user_id"), body.get("device_id")
        for name, value in (("user_id", user), ("device_id", device)):
            if not isinstance(value, str) or not _ID.match(value):
                return web.json_response(
                    {"error": "bad_request", "detail": f"{name}: 1-64 of [A-Za-z0-9_.:@-]"},
                    status=400,
                )
        assert isinstance(user, str) and isinstance(device, str)
        issued = codec.issue_access(
            cfg.tenant_id,
            user,
            device,
            now_ms=time.time_ns() // 1_000_000,
            ttl_ms=auth.access_token_ttl_ms,
        )
        return web.json_response(
            {
                "access_token": issued.token,
                "tenant_id": cfg.tenant_id,
                "user_id": user,
                "device_id": device,
                "gateway_url": cfg.gateway_url,
                "expires_at": issued.claims.expires_at_ms,
            }
        )

    app = web.Application(middlewares=[_loopback_only])
    app.router.add_get("/", index)
    app.router.add_get("/dev/config", config)
    app.router.add_post("/dev/token", token)
    # A static route needs its folder at start; a stack without the built SDK still runs.
    for prefix, folder in (
        ("/app/", web_dir),
        ("/sdk/", dist_dir),
        ("/vendor/msgpack/", msgpack_dir),
    ):
        if folder.is_dir():
            app.router.add_static(prefix, folder)
    return app


async def start_dev_web(cfg: DevWebConfig, port: int) -> web.AppRunner:
    """Start the app on ``cfg.host:port``; the caller cleans the runner up."""
    runner = web.AppRunner(make_dev_web_app(cfg))
    await runner.setup()
    try:
        await web.TCPSite(runner, cfg.host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
