"""Login sync as pure functions (spec 6.8, 6.10, 9.3, 9.4, 9.6; seed 003 M-4, M-7).

* :mod:`~qim.core.sync.cursor` - the HMAC-signed ``MailboxCursor`` token and its key ring;
* :mod:`~qim.core.sync.auth` - the AUTH-time checks (CURSOR_INVALID / CURSOR_EXPIRED /
  CURSOR_REBASED / AUTH_OK sync fields) in the order of 9.3.1;
* :mod:`~qim.core.sync.paging` - PULL_MAILBOX -> MAILBOX_BATCH under the three
  ``covered_through_seq`` rules of 9.3.3;
* :mod:`~qim.core.sync.progress` - the per-session record that decides SYNC_COMPLETE.

No I/O: storage comes in as callables (``GroupReader``, ``PendingLookup``, ``BoundaryLookup``)
and time as ``now_ms``, so the MailboxNode wires its store and every rule is testable alone.
"""

from qim.core.sync.auth import (
    NOTHING_PENDING,
    AuthSync,
    BoundaryLookup,
    CursorIdentity,
    CursorKind,
    PendingLookup,
    PendingSummary,
    check_auth_cursor,
)
from qim.core.sync.cursor import (
    CURSOR_TOKEN_VERSION,
    CursorClaims,
    CursorKey,
    CursorKeyRing,
    CursorTokenError,
    sign_cursor,
    verify_cursor,
)
from qim.core.sync.errors import (
    SyncInvariantError,
    cursor_expired,
    cursor_invalid,
    cursor_rebased,
    shard_moved,
    sync_incomplete,
)
from qim.core.sync.paging import (
    DEFAULT_PULL_LIMITS,
    Group,
    GroupReader,
    PullLimits,
    PullWindow,
    cut_batch,
    pull_mailbox,
    resolve_pull,
    strip_body,
)
from qim.core.sync.progress import DEFAULT_MAX_PENDING_RANGES, SyncProgress

__all__ = [
    "CURSOR_TOKEN_VERSION",
    "DEFAULT_MAX_PENDING_RANGES",
    "DEFAULT_PULL_LIMITS",
    "NOTHING_PENDING",
    "AuthSync",
    "BoundaryLookup",
    "CursorClaims",
    "CursorIdentity",
    "CursorKey",
    "CursorKeyRing",
    "CursorKind",
    "CursorTokenError",
    "Group",
    "GroupReader",
    "PendingLookup",
    "PendingSummary",
    "PullLimits",
    "PullWindow",
    "SyncInvariantError",
    "SyncProgress",
    "check_auth_cursor",
    "cursor_expired",
    "cursor_invalid",
    "cursor_rebased",
    "cut_batch",
    "pull_mailbox",
    "resolve_pull",
    "shard_moved",
    "sign_cursor",
    "strip_body",
    "sync_incomplete",
    "verify_cursor",
]
