"""AuthService settings and where its signing keys come from.

Defaults are the spec's (App. B.1 / B.4, §15.3): ``access_token_ttl`` 1 h, ``route_token_ttl``
60 s single use, ``revocation_record_retention`` = ``access_token_ttl`` + 2 h margin.

Signing keys (every process that issues or verifies tokens must load the same ring):

1. env ``QIM_AUTH_KEYS`` = ``"kid1:base64secret,kid2:base64secret"``; the first key is active
   (signs), the others still verify (key rotation). Secrets are >= 32 bytes; make one with
   ``qim token keygen``. Rotate: prepend a new key, keep the old one for at least
   ``access_token_ttl`` + clock skew, then drop it.
2. otherwise a development ring in the file named by env ``QIM_AUTH_KEYS_FILE``, default
   ``<repo>/.run/auth-keys`` (git-ignored). It is generated with one random key on first use
   (mode 0600, published atomically so concurrent first starts agree on one key). Never use it in
   production: anyone who can read the checkout can mint tokens.

Other env knobs read by :meth:`AuthConfig.from_env` (all optional):
``QIM_AUTH_ACCESS_TOKEN_TTL_S``, ``QIM_AUTH_MAX_TOKEN_TTL_S``, ``QIM_AUTH_CLOCK_SKEW_S``,
``QIM_AUTH_MIN_CLIENT_VERSION``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from qim.auth.tokens import DEFAULT_CLOCK_SKEW_MS, KeyRing, SigningKey
from qim.auth.versions import parse_client_version
from qim.params import Settings
from qim.schemas.routing import ShardConfig

__all__ = [
    "DEFAULT_ACCESS_TOKEN_TTL_MS",
    "DEFAULT_DEV_KEYS_PATH",
    "DEFAULT_EPOCH_KEY_TTL_MS",
    "DEFAULT_REVOCATION_MARGIN_MS",
    "DEFAULT_ROUTE_TOKEN_TTL_MS",
    "ENV_KEYS",
    "ENV_KEYS_FILE",
    "AuthConfig",
    "KeySource",
    "load_keyring",
]

DEFAULT_ACCESS_TOKEN_TTL_MS: Final = 3_600_000  # B.4 access_token_ttl = 1 h
DEFAULT_ROUTE_TOKEN_TTL_MS: Final = 60_000  # B.1 route_token_ttl = 60 s
DEFAULT_REVOCATION_MARGIN_MS: Final = 7_200_000  # B.4 revocation_record_retention margin 2 h
DEFAULT_EPOCH_KEY_TTL_MS: Final = 60 * 86_400_000  # B.3 device_inactive_gc_days = 60

ENV_KEYS: Final = "QIM_AUTH_KEYS"
ENV_KEYS_FILE: Final = "QIM_AUTH_KEYS_FILE"
DEFAULT_DEV_KEYS_PATH: Final = Path(__file__).resolve().parents[2] / ".run" / "auth-keys"

KeySource = Literal["env", "dev-file"]


def _positive_ms(value: int, name: str, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int of milliseconds")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


@dataclass(frozen=True)
class AuthConfig:
    """Everything AuthService needs besides Redis and the keys; validated on construction."""

    access_token_ttl_ms: int = DEFAULT_ACCESS_TOKEN_TTL_MS
    max_access_token_ttl_ms: int | None = None
    """Cap on per-request TTL overrides (default: ``access_token_ttl_ms``). It bounds how long a
    device/user revocation record must live, so raise it consciously."""
    route_token_ttl_ms: int = DEFAULT_ROUTE_TOKEN_TTL_MS
    clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS
    revocation_margin_ms: int = DEFAULT_REVOCATION_MARGIN_MS
    epoch_key_ttl_ms: int = DEFAULT_EPOCH_KEY_TTL_MS
    """Idle lifetime of a device's session_epoch counter. Expiry is safe: the next epoch is
    never below the wall clock in ms, so it still exceeds every epoch issued before."""
    minimum_client_version: str | None = None
    tenant_minimum_client_version: Mapping[str, str] = field(default_factory=dict)
    """Per-tenant override of the global minimum (§27.1.3: raise it tenant by tenant)."""
    shards: ShardConfig = field(default_factory=lambda: configured_shards())
    """Must equal the gateway's and MailboxNode's routing config, or AUTH_OK routes wrongly."""
    key_prefix: str = "qim"
    refresh_token_ttl_ms: int = 30 * 86_400_000
    """Appendix B ``refresh_token_ttl`` (30 d, sliding: every rotation starts it again)."""
    jwt_issuers_file: Path | None = None
    """Standard JWTs a tenant's own backend mints (``qim.auth.standard_jwt``); None: qat1 only."""

    def __post_init__(self) -> None:
        _positive_ms(self.access_token_ttl_ms, "access_token_ttl_ms")
        if self.max_access_token_ttl_ms is not None:
            _positive_ms(self.max_access_token_ttl_ms, "max_access_token_ttl_ms")
            if self.max_access_token_ttl_ms < self.access_token_ttl_ms:
                raise ValueError("max_access_token_ttl_ms must be >= access_token_ttl_ms")
        if self.max_token_ttl_ms > 365 * 86_400_000:
            raise ValueError("token lifetimes above 365 days are refused (revocation must end)")
        _positive_ms(self.route_token_ttl_ms, "route_token_ttl_ms")
        _positive_ms(self.clock_skew_ms, "clock_skew_ms", allow_zero=True)
        _positive_ms(self.revocation_margin_ms, "revocation_margin_ms", allow_zero=True)
        _positive_ms(self.epoch_key_ttl_ms, "epoch_key_ttl_ms")
        versions = [self.minimum_client_version, *self.tenant_minimum_client_version.values()]
        for version in versions:
            if version is not None and parse_client_version(version) is None:
                raise ValueError(f"minimum client version {version!r} is not a version")
        if not self.key_prefix or ":" in self.key_prefix:
            raise ValueError("key_prefix must be non-empty and contain no ':'")

    @property
    def max_token_ttl_ms(self) -> int:
        return self.max_access_token_ttl_ms or self.access_token_ttl_ms

    @property
    def revocation_retention_ms(self) -> int:
        """How long a revocation must be remembered: until every token it hits has expired."""
        return self.max_token_ttl_ms + self.clock_skew_ms + self.revocation_margin_ms

    def minimum_for(self, tenant_id: str) -> str | None:
        return self.tenant_minimum_client_version.get(tenant_id, self.minimum_client_version)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> AuthConfig:
        """Defaults, then the ``QIM_AUTH_*`` variables, then explicit ``overrides``."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        seconds = {
            "QIM_AUTH_ACCESS_TOKEN_TTL_S": "access_token_ttl_ms",
            "QIM_AUTH_MAX_TOKEN_TTL_S": "max_access_token_ttl_ms",
            "QIM_AUTH_CLOCK_SKEW_S": "clock_skew_ms",
            "QIM_AUTH_REFRESH_TOKEN_TTL_S": "refresh_token_ttl_ms",
        }
        for var, name in seconds.items():
            raw = env.get(var, "").strip()
            if raw:
                try:
                    values[name] = int(raw) * 1000
                except ValueError:
                    raise ValueError(f"{var} must be an integer number of seconds") from None
        minimum = env.get("QIM_AUTH_MIN_CLIENT_VERSION", "").strip()
        if minimum:
            values["minimum_client_version"] = minimum
        issuers = env.get("QIM_JWT_ISSUERS_FILE", "").strip()
        if issuers:
            values["jwt_issuers_file"] = Path(issuers)
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def _dev_keyring(path: Path) -> KeyRing:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(KeyRing([SigningKey.generate("dev1")]).format() + "\n")
            with contextlib.suppress(FileExistsError):  # a concurrent first start won: keep its key
                os.link(tmp, path)  # atomic publish of a complete file
        finally:
            tmp.unlink(missing_ok=True)
    return KeyRing.parse(path.read_text())


def load_keyring(
    env: Mapping[str, str] | None = None, dev_path: Path | None = None
) -> tuple[KeyRing, KeySource]:
    """The configured key ring and where it came from (see the module docstring)."""
    env = os.environ if env is None else env
    spec = env.get(ENV_KEYS, "").strip()
    if spec:
        return KeyRing.parse(spec), "env"
    if dev_path is None:
        override = env.get(ENV_KEYS_FILE, "").strip()
        dev_path = Path(override) if override else DEFAULT_DEV_KEYS_PATH
    return _dev_keyring(dev_path), "dev-file"


def configured_shards(settings: Settings | None = None) -> ShardConfig:
    """The routing configuration of this installation (qim.params), not the target-tier defaults."""
    s = settings if settings is not None else Settings.load()
    return ShardConfig(
        virtual_bucket_count=s.virtual_bucket_count,
        mailbox_shard_count=s.mailbox_shard_count,
        connection_shard_count=s.connection_shard_count,
        lane_count=s.lane_count,
    )
