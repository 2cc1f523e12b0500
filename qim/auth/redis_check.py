"""The AuthService refuses a Redis that would lose or evict its state (issue 21, M-6).

Why at start: Redis holds every device's ``session_epoch`` watermark and every revocation. A
Redis that evicts keys under memory pressure, or keeps nothing across a restart, silently
un-revokes a stolen device and lets an epoch go backwards (I-10); a Redis Cluster splits the
Lua scripts' keys across slots. None of that shows until it is too late, so the gateway and the
auth endpoint check once, before serving, and stop with a message saying what to change.

Rules (:func:`judge_redis`, pure over the server's INFO / CONFIG answers):

* ``redis_version`` >= 7.0 (the scripts use 7's commands and the suite runs 7);
* not cluster mode (``cluster_enabled:0``);
* ``maxmemory-policy`` = ``noeviction`` (a full Redis refuses writes, which a login reports,
  instead of dropping revocations);
* persistence on: AOF (``aof_enabled:1``) or RDB snapshots (a non-empty ``save``).

A managed Redis that disables CONFIG still answers INFO: the policy is read from INFO memory and
RDB is then unknown, so AOF is required.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

__all__ = ["UnsafeRedisError", "ensure_safe_redis", "judge_redis"]

_MIN_VERSION = (7, 0)


class UnsafeRedisError(RuntimeError):
    """This Redis would lose or evict auth state; the message lists every problem."""


def _version(text: object) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split(".")[:2])
    except ValueError:
        return (0,)


def judge_redis(info: Mapping[str, Any], save: str | None) -> list[str]:
    """Every reason this server is unsafe for the AuthService ([] = safe).

    ``info`` is the merged INFO server / persistence / memory / cluster answer; ``save`` the
    ``save`` configuration, or None when CONFIG is not allowed.
    """
    problems = []
    version = info.get("redis_version", "?")
    if _version(version) < _MIN_VERSION:
        problems.append(f"redis_version {version} is older than 7.0")
    if str(info.get("cluster_enabled", 0)) == "1":
        problems.append("cluster mode is on: the auth scripts need one keyspace (M-6)")
    policy = info.get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        problems.append(
            f"maxmemory-policy is {policy}: evicting keys would drop revocations and epoch "
            "watermarks; set it to noeviction"
        )
    aof = str(info.get("aof_enabled", 0)) == "1"
    rdb = bool(save and save.strip())
    if not aof and not rdb:
        problems.append(
            "persistence is off (appendonly no"
            + (', save ""' if save is not None else ", save unknown: CONFIG is not allowed")
            + "): a restart would forget every revocation; turn appendonly on"
        )
    return problems


async def ensure_safe_redis(redis: Redis) -> None:
    """Raise :class:`UnsafeRedisError` naming every problem of the connected server."""
    info: dict[str, Any] = {}
    for section in ("server", "persistence", "memory", "cluster"):
        info.update(await redis.info(section))
    save: str | None
    try:
        answer: dict[Any, Any] = dict(await redis.config_get("save"))
        raw = answer.get("save", answer.get(b"save", ""))
        save = raw.decode() if isinstance(raw, bytes) else str(raw)
    except ResponseError:
        save = None
    problems = judge_redis(info, save)
    if problems:
        raise UnsafeRedisError(
            "this Redis is not safe for qim's auth state: " + "; ".join(problems)
        )
