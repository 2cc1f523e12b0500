"""The 16 error codes of App. A.6 as a registry keyed by wire value, aiokafka-style.

``ERROR.code`` travels as a u16. The numeric values are the row numbers of A.6 (1..16) and are
frozen: a value is never reused or renumbered (§27.2.1 rule 2); 0 means "no code". A code this
build does not know still decodes - :func:`for_code` hands back an "unknown" spec whose client
action is "back off per retry_after_ms, else reconnect_backoff" (§27.1.2), never "fatal".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Final

__all__ = [
    "ERROR_CODES",
    "RETRY_AFTER_NEVER_MS",
    "ClientAction",
    "ErrorCode",
    "ErrorCodeSpec",
    "for_code",
]


RETRY_AFTER_NEVER_MS: Final = 0xFFFF_FFFF
"""``retry_after_ms`` of a refusal no wait can fix (a request over a size limit, such as more
than ``presence_sub_max_targets`` targets): 20.4.1 rule 2 wants a ``retry_after_ms`` on every
RATE_LIMITED and A.6 has no "too many" code, so the hint is the largest u32 (~49.7 days),
which means "do not retry this request" (the SDK's :func:`qim.client.retry_delay_ms` returns
None for it). No schema change: the field already exists and old clients just wait."""


class ErrorCode(IntEnum):
    """Wire values of ``ERROR.code``; the number is the A.6 row."""

    CURSOR_EXPIRED = 1
    CURSOR_REBASED = 2
    CURSOR_INVALID = 3
    MAILBOX_DIRTY = 4
    SYNC_INCOMPLETE = 5
    SHARD_MOVED = 6
    REGION_FAILOVER = 7
    RATE_LIMITED = 8
    FANOUT_QUOTA_EXCEEDED = 9
    TOKEN_EXPIRED = 10
    TOKEN_REVOKED = 11
    UPGRADE_REQUIRED = 12
    CLOCK_UNSAFE = 13
    PAYLOAD_TOO_LARGE = 14
    PERMISSION_DENIED = 15
    PREKEY_EXHAUSTED = 16


class ClientAction(Enum):
    """What A.6 tells the client to do; the SDK switches on this, not on the code."""

    REBUILD = "rebuild"  # §9.6 REBUILD
    REPLAY_FROM_SEQ = "replay_from_seq"  # replay from replay_from_seq, dedup idempotently
    REAUTHENTICATE = "reauthenticate"
    PULL_MAILBOX_AGAIN = "pull_mailbox_again"
    KEEP_PULLING = "keep_pulling"
    RECONNECT_PER_REDIRECT = "reconnect_per_redirect"
    BACKOFF_RETRY = "backoff_retry"  # per retry_after_ms, else reconnect_backoff
    SHOW_SEND_FAILURE = "show_send_failure"  # never silently drop
    REFRESH_TOKEN_RECONNECT = "refresh_token_reconnect"
    WIPE_AND_LOGIN = "wipe_and_login"
    PROMPT_UPGRADE = "prompt_upgrade"
    REJECT_LOCALLY = "reject_locally"
    DO_NOT_RETRY = "do_not_retry"
    RETRY_LATER = "retry_later"


@dataclass(frozen=True, slots=True)
class ErrorCodeSpec:
    """One A.6 row: which ``ERROR`` extras belong to the code and what the client does."""

    code: int
    name: str
    meaning: str
    action: ClientAction
    extras: tuple[str, ...] = ()
    known: bool = True


def _spec(
    code: ErrorCode, meaning: str, action: ClientAction, *extras: str
) -> tuple[int, ErrorCodeSpec]:
    return int(code), ErrorCodeSpec(int(code), code.name, meaning, action, extras)


_A = ClientAction
ERROR_CODES: Final[dict[int, ErrorCodeSpec]] = dict(
    [
        _spec(
            ErrorCode.CURSOR_EXPIRED,
            "cursor older than mailbox_trim_watermark",
            _A.REBUILD,
            "trim_watermark",
            "rebuild_required",
        ),
        _spec(
            ErrorCode.CURSOR_REBASED,
            "shard_epoch behind but boundary resolvable",
            _A.REPLAY_FROM_SEQ,
            "new_cursor",
            "replay_from_seq",
        ),
        _spec(
            ErrorCode.CURSOR_INVALID,
            "cursor signature invalid or seq out of range",
            _A.REAUTHENTICATE,
        ),
        _spec(ErrorCode.MAILBOX_DIRTY, "server dropped in-flight data", _A.PULL_MAILBOX_AGAIN),
        _spec(
            ErrorCode.SYNC_INCOMPLETE,
            "SYNC_COMPLETE seq does not match the server's",
            _A.KEEP_PULLING,
        ),
        _spec(ErrorCode.SHARD_MOVED, "shard migrated", _A.RECONNECT_PER_REDIRECT),
        _spec(
            ErrorCode.REGION_FAILOVER,
            "Home Region switching",
            _A.BACKOFF_RETRY,
            "retry_after_ms",
        ),
        _spec(
            ErrorCode.RATE_LIMITED,
            "user- or conversation-level rate limit",
            _A.BACKOFF_RETRY,
            "retry_after_ms",
        ),
        _spec(
            ErrorCode.FANOUT_QUOTA_EXCEEDED,
            "tenant fanout quota hit",
            _A.SHOW_SEND_FAILURE,
            "retry_after_ms",  # 8.2 / 10.5.2: ERROR{code=FANOUT_QUOTA_EXCEEDED, retry_after_ms}
        ),
        _spec(ErrorCode.TOKEN_EXPIRED, "access token expired", _A.REFRESH_TOKEN_RECONNECT),
        _spec(ErrorCode.TOKEN_REVOKED, "remote logout or device revoked", _A.WIPE_AND_LOGIN),
        _spec(
            ErrorCode.UPGRADE_REQUIRED,
            "client below minimum_client_version",
            _A.PROMPT_UPGRADE,
            "minimum_client_version",
        ),
        _spec(
            ErrorCode.CLOCK_UNSAFE,
            "server clock stepped back beyond threshold",
            _A.BACKOFF_RETRY,
            "retry_after_ms",
        ),
        _spec(
            ErrorCode.PAYLOAD_TOO_LARGE,
            "exceeds max_custom_payload_bytes or another size limit",
            _A.REJECT_LOCALLY,
        ),
        _spec(
            ErrorCode.PERMISSION_DENIED,
            "tenant/conversation/role authorization failed",
            _A.DO_NOT_RETRY,
        ),
        _spec(
            ErrorCode.PREKEY_EXHAUSTED,
            "target device's one-time prekeys exhausted and fallback disabled",
            _A.RETRY_LATER,
            "retry_after_ms",
        ),
    ]
)


def for_code(code: int) -> ErrorCodeSpec:
    """Look a wire code up; an unknown one is tolerated, not raised (§27.1.2)."""
    spec = ERROR_CODES.get(code)
    if spec is not None:
        return spec
    return ErrorCodeSpec(
        code=code,
        name=f"UNKNOWN_{code}",
        meaning="code unknown to this build",
        action=ClientAction.BACKOFF_RETRY,
        extras=("retry_after_ms",),
        known=False,
    )
