"""AuthService: access/route tokens, revocation and ``session_epoch`` (spec §5.4.4, §15, §20).

* :mod:`qim.auth.tokens`  pure signing/verification and the rotating :class:`KeyRing`;
* :mod:`qim.auth.service` the Redis-backed :class:`AuthService` the gateway calls at login;
* :mod:`qim.auth.admin`   the admin HTTP endpoint; :mod:`qim.auth.cli` ``qim token ...``;
* :mod:`qim.auth.config`  settings and where keys come from (``QIM_AUTH_KEYS``).

Every failure is an :class:`AuthError` whose ``code`` is an App. A.6 code, verbatim.
"""

from qim.auth.config import AuthConfig, load_keyring
from qim.auth.errors import (
    PERMISSION_DENIED,
    TOKEN_EXPIRED,
    TOKEN_REVOKED,
    UPGRADE_REQUIRED,
    AuthError,
    AuthErrorCode,
)
from qim.auth.service import (
    AuthGrant,
    AuthService,
    BoundSession,
    KickReason,
    Revocation,
    RevocationSink,
)
from qim.auth.tokens import (
    AccessClaims,
    Issued,
    KeyRing,
    RouteClaims,
    SigningKey,
    TokenCodec,
)
from qim.auth.versions import client_version_at_least, parse_client_version

__all__ = [
    "PERMISSION_DENIED",
    "TOKEN_EXPIRED",
    "TOKEN_REVOKED",
    "UPGRADE_REQUIRED",
    "AccessClaims",
    "AuthConfig",
    "AuthError",
    "AuthErrorCode",
    "AuthGrant",
    "AuthService",
    "BoundSession",
    "Issued",
    "KeyRing",
    "KickReason",
    "Revocation",
    "RevocationSink",
    "RouteClaims",
    "SigningKey",
    "TokenCodec",
    "client_version_at_least",
    "load_keyring",
    "parse_client_version",
]
