"""Redis key layout of AuthService: unambiguous across tenants, users and devices.

Every id is written as ``<utf-8 byte length>:<id>``, so no choice of ids (colons, braces,
digits) can make two different ``(tenant, user, device)`` tuples share a key: the lengths say
exactly where each field ends. Example: tenant ``a:b`` user ``c`` ->
``qim:auth:epoch:3:a:b:1:c:...`` and tenant ``a`` user ``b:c`` -> ``qim:auth:epoch:1:a:3:b:c:...``.

Keys (``P`` = configured prefix, default ``qim``)::

    P:auth:epoch:<t>:<u>:<d>           session_epoch counter of one device (§5.4.4)
    P:auth:revoked-device:<t>:<u>:<d>  revoked_at ms: tokens issued at or before it are revoked
    P:auth:revoked-user:<t>:<u>        same for all devices of a user (logout everywhere, ban)
    P:auth:revoked-token:<jti>         one revoked access token (§15.3.2)
    P:auth:route-used:<jti>            a consumed route_token (single use, §5.3.2)
"""

from __future__ import annotations

__all__ = [
    "device_revocation_key",
    "epoch_key",
    "route_used_key",
    "token_revocation_key",
    "user_revocation_key",
]


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return str(len(raw)).encode("ascii") + b":" + raw


def _key(prefix: str, kind: str, *fields: str) -> bytes:
    return b":".join(
        [prefix.encode("ascii"), b"auth", kind.encode("ascii")] + [_field(f) for f in fields]
    )


def epoch_key(prefix: str, tenant_id: str, user_id: str, device_id: str) -> bytes:
    return _key(prefix, "epoch", tenant_id, user_id, device_id)


def device_revocation_key(prefix: str, tenant_id: str, user_id: str, device_id: str) -> bytes:
    return _key(prefix, "revoked-device", tenant_id, user_id, device_id)


def user_revocation_key(prefix: str, tenant_id: str, user_id: str) -> bytes:
    return _key(prefix, "revoked-user", tenant_id, user_id)


def token_revocation_key(prefix: str, token_id: str) -> bytes:
    return _key(prefix, "revoked-token", token_id)


def route_used_key(prefix: str, token_id: str) -> bytes:
    return _key(prefix, "route-used", token_id)
