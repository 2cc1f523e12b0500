"""The one exception every auth failure raises, carrying an App. A.6 code verbatim.

The gateway turns an :class:`AuthError` into ``ERROR{code, detail, +extras}`` without having to
know why auth failed. Only four A.6 codes can come out of auth:

* ``TOKEN_EXPIRED``   -- the access token's ``expires_at`` has passed (§20.2.1, A.6 #10);
* ``TOKEN_REVOKED``   -- its ``token_id``, its device or its user was revoked (§15.3.2, A.6 #11);
* ``UPGRADE_REQUIRED``-- ``client_version`` below the global minimum (§27.1.3, A.6 #12), with the
  extra ``minimum_client_version``;
* ``PERMISSION_DENIED``-- everything else: forged or tampered signature, unknown ``kid``,
  malformed token, a token bound to another device, a bad/reused/expired ``route_token``.
  A.6 has no "invalid token" code; §20.2.2 says every authorization failure is
  ``PERMISSION_DENIED`` (not retried, no oracle), and the client actions of the other codes would
  be wrong for a forgery (refresh-and-retry, or wipe local data).

``detail`` is what the client sees and is deliberately coarse (``invalid_token`` for every kind
of forgery); ``reason`` is fine-grained, for metrics and logs only, and never contains token
material (§20.6).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = [
    "AUTH_ERROR_CODES",
    "PERMISSION_DENIED",
    "TOKEN_EXPIRED",
    "TOKEN_REVOKED",
    "UPGRADE_REQUIRED",
    "AuthError",
    "AuthErrorCode",
]

AuthErrorCode = Literal["PERMISSION_DENIED", "TOKEN_EXPIRED", "TOKEN_REVOKED", "UPGRADE_REQUIRED"]

PERMISSION_DENIED: Final = "PERMISSION_DENIED"
TOKEN_EXPIRED: Final = "TOKEN_EXPIRED"
TOKEN_REVOKED: Final = "TOKEN_REVOKED"
UPGRADE_REQUIRED: Final = "UPGRADE_REQUIRED"
AUTH_ERROR_CODES: Final[frozenset[str]] = frozenset(
    {PERMISSION_DENIED, TOKEN_EXPIRED, TOKEN_REVOKED, UPGRADE_REQUIRED}
)


class AuthError(Exception):
    """An auth failure the gateway maps 1:1 onto an ``ERROR`` frame (App. A.6)."""

    code: AuthErrorCode
    detail: str
    reason: str
    extras: Mapping[str, object]

    def __init__(
        self,
        code: AuthErrorCode,
        *,
        detail: str,
        reason: str | None = None,
        extras: Mapping[str, object] | None = None,
    ) -> None:
        if code not in AUTH_ERROR_CODES:  # a typo here would reach clients as an unknown code
            raise ValueError(f"not an auth error code from App. A.6: {code!r}")
        self.code = code
        self.detail = detail
        self.reason = reason if reason is not None else detail
        self.extras = dict(extras) if extras else {}
        super().__init__(f"{code}: {self.reason}")

    def error_fields(self) -> dict[str, object]:
        """The ``ERROR`` frame body (minus ``request_id`` / ``retry_after_ms``) for this failure."""
        return {"code": self.code, "detail": self.detail, **self.extras}

    def __repr__(self) -> str:
        return f"AuthError(code={self.code!r}, reason={self.reason!r}, extras={self.extras!r})"
