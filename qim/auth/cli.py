"""``qim token ...``: mint access tokens, make signing keys, run the admin endpoint.

Register on the main CLI with ``main.add_command(token)`` (``from qim.auth.cli import token``).
Keys come from ``QIM_AUTH_KEYS`` or the development file ``.run/auth-keys`` (created on first
use); see :mod:`qim.auth.config`. A token printed here verifies on every process that loaded
the same key ring, e.g. the gateway started by ``qim up``.
"""

from __future__ import annotations

import json
import os
import time
from typing import cast

import click

from qim.auth.config import DEFAULT_DEV_KEYS_PATH, ENV_KEYS_FILE, AuthConfig, load_keyring
from qim.auth.tokens import KeyRing, SigningKey, TokenCodec
from qim.streams import runtime

__all__ = ["token"]


def _keyring_note(source: str) -> None:
    if source == "dev-file":
        path = os.environ.get(ENV_KEYS_FILE) or str(DEFAULT_DEV_KEYS_PATH)
        click.echo(f"note: using the development key ring in {path} (set QIM_AUTH_KEYS)", err=True)


@click.group("token")
def token() -> None:
    """Issue access tokens, generate signing keys and serve the auth admin endpoint."""


@token.command("issue")
@click.option("--tenant", "tenant_id", required=True, help="tenant_id the token is for.")
@click.option("--user", "user_id", required=True, help="user_id the token is for.")
@click.option("--device", "device_id", default=None, help="Bind to one device_id (default: any).")
@click.option(
    "--ttl",
    "ttl_s",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds; default access_token_ttl.",
)
@click.option("--json", "as_json", is_flag=True, help="Print token_id and expires_at too.")
def issue(
    tenant_id: str, user_id: str, device_id: str | None, ttl_s: int | None, as_json: bool
) -> None:
    """Print a signed access_token."""
    try:
        config = AuthConfig.from_env()
        keyring, source = load_keyring()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _keyring_note(source)
    ttl_ms = config.access_token_ttl_ms if ttl_s is None else ttl_s * 1000
    if ttl_ms > config.max_token_ttl_ms:
        raise click.BadParameter(
            f"at most {config.max_token_ttl_ms // 1000} s (QIM_AUTH_MAX_TOKEN_TTL_S)",
            param_hint="--ttl",
        )
    codec = TokenCodec(keyring, clock_skew_ms=config.clock_skew_ms)
    try:
        issued = codec.issue_access(
            tenant_id, user_id, device_id, now_ms=time.time_ns() // 1_000_000, ttl_ms=ttl_ms
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        claims = issued.claims
        click.echo(
            json.dumps(
                {
                    "access_token": issued.token,
                    "token_id": claims.token_id,
                    "issued_at": claims.issued_at_ms,
                    "expires_at": claims.expires_at_ms,
                }
            )
        )
    else:
        click.echo(issued.token)


@token.command("revoke")
@click.option("--tenant", "tenant_id", default=None, help="With --user: the user's tenant_id.")
@click.option("--user", "user_id", default=None, help="Every device of this user ...")
@click.option("--device", "device_id", default=None, help="... or only this device_id.")
@click.option("--token-id", default=None, help="Or one token (its token_id, or a JWT's jti).")
@click.option(
    "--reason",
    type=click.Choice(["token_revoked", "admin", "banned"]),
    default="token_revoked",
    show_default=True,
)
@click.option(
    "--redis-url", envvar="QIM_REDIS_URL", default="redis://127.0.0.1:16379/0", show_default=True
)
@click.option(
    "--bootstrap", envvar="QIM_KAFKA_BOOTSTRAP", default="127.0.0.1:19092", show_default=True
)
def revoke(
    tenant_id: str | None,
    user_id: str | None,
    device_id: str | None,
    token_id: str | None,
    reason: str,
    redis_url: str,
    bootstrap: str,
) -> None:
    """Revoke a token, a device or a user: the next login is refused (Redis) and every live
    session it ends is kicked on every gateway (qim.revocations)."""
    from redis.asyncio import Redis

    from qim.auth.revocation_sink import KafkaRevocationSink
    from qim.auth.service import AuthService, KickReason

    if (token_id is None) == (user_id is None) or (user_id is not None and tenant_id is None):
        raise click.UsageError("give --token-id, or --tenant and --user (and maybe --device)")
    config = AuthConfig.from_env()
    keyring, _source = load_keyring()

    async def run() -> dict[str, object]:
        redis = Redis.from_url(redis_url)
        sink = KafkaRevocationSink(bootstrap)
        await sink.start()
        try:
            service = AuthService(redis, keyring, config, revocation_sink=sink)
            kick = cast(KickReason, reason)  # one of click's choices
            if token_id is not None:
                done = await service.revoke_token(token_id, reason=kick)
            elif device_id is not None:
                assert tenant_id is not None and user_id is not None
                done = await service.revoke_device(
                    tenant_id,
                    user_id,
                    device_id,
                    reason=kick,
                )
            else:
                assert tenant_id is not None and user_id is not None
                done = await service.revoke_user(tenant_id, user_id, reason=kick)
            return done.to_json()
        finally:
            await sink.stop()
            await redis.aclose()

    try:
        click.echo(json.dumps(runtime.run(run())))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@token.command("keygen")
@click.option("--kid", default=None, help="Key id ([A-Za-z0-9_-]{1,32}); random if omitted.")
def keygen(kid: str | None) -> None:
    """Print a new 'kid:base64secret' entry; prepend it to QIM_AUTH_KEYS to rotate."""
    try:
        key = SigningKey.generate(kid)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--kid") from None
    click.echo(KeyRing([key]).format())


@token.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=16090, show_default=True)
@click.option(
    "--redis-url", envvar="QIM_REDIS_URL", default="redis://127.0.0.1:16379/0", show_default=True
)
@click.option(
    "--admin-secret",
    envvar="QIM_AUTH_ADMIN_SECRET",
    required=True,
    help="Shared secret clients send in X-Qim-Admin-Secret (env QIM_AUTH_ADMIN_SECRET).",
)
def serve(host: str, port: int, redis_url: str, admin_secret: str) -> None:
    """Run the admin HTTP endpoint (POST /v1/tokens, POST /v1/revocations) until Ctrl-C."""
    from redis.asyncio import Redis

    from qim.auth.admin import AdminServer, serve_admin
    from qim.auth.redis_check import UnsafeRedisError, ensure_safe_redis
    from qim.auth.revocation_sink import KafkaRevocationSink
    from qim.auth.service import AuthService

    try:
        config = AuthConfig.from_env()
        keyring, source = load_keyring()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    _keyring_note(source)

    def ready(server: AdminServer) -> None:
        click.echo(f"auth admin endpoint on {server.url}")

    async def run() -> None:
        redis = Redis.from_url(redis_url)
        bootstrap = os.environ.get("QIM_KAFKA_BOOTSTRAP", "").strip()
        sink = KafkaRevocationSink(bootstrap) if bootstrap else None
        try:
            await ensure_safe_redis(redis)  # M-6: refuse before serving
            if sink is not None:
                await sink.start()  # revocations reach live sessions (qim.revocations)
            service = AuthService(redis, keyring, config, revocation_sink=sink)
            await serve_admin(service, admin_secret, host=host, port=port, ready=ready)
        finally:
            if sink is not None:
                await sink.stop()
            await redis.aclose()

    try:
        runtime.run(run())
    except KeyboardInterrupt:
        pass
    except (ValueError, UnsafeRedisError) as exc:
        raise click.ClickException(str(exc)) from None
