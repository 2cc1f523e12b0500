"""AUTH-time cursor checks, in the fixed order of spec 9.3.1, and the sync fields of AUTH_OK.

1. CURSOR_INVALID - the token is not ours (bad signature, unknown key, malformed), its claims
   name another tenant, user, device or lane, it names a shard or epoch this user cannot have,
   or ``last_applied_mailbox_seq > W[lane]`` (6.8, 26.7.2). The lane is signed in and never
   changes (I-12); a different shard is legitimate only across an epoch bump (a split, 5.5.2).
2. CURSOR_EXPIRED{trim_watermark, rebuild_required=true} - a non-zero cursor below
   ``effective_trim(user)``. Never softened into AUTH_OK{has_offline=true} (26.1.6, 26.2.6).
3. CURSOR_REBASED{new_cursor, replay_from_seq} - the token's ``shard_epoch`` is behind and the
   epoch boundary resolves; ``new_cursor`` is re-signed for the current shard and epoch (lane
   kept) and ``replay_from_seq`` is the exclusive position to pull from, duplicates being
   absorbed by the client's (message_id, event_id) dedup. An unresolvable boundary (trimmed, or
   the old log past retention) is CURSOR_EXPIRED instead (5.5.3 answer 2).
4. AUTH_OK - ``sync_to_seq := W[lane]`` at AUTH, the authoritative equation of 9.3.1 (I-19).

Three kinds of cursor reach step 4. Decisions, since the spec leaves the wire shape open:

* no cursor, or an empty token: a new device (9.6.1). It starts at ``effective_trim`` - what is
  above it is still in retention, what is below is history, not this device's gap (I-33). A
  bare seq without a token cannot be verified, so it is ignored rather than trusted.
* a valid token with ``last_applied_mailbox_seq = 0``: the REBUILD re-handshake (9.6.3 step 0:
  "keeps the identity fields of its old token and re-AUTHs with the cursor empty"). That is how
  the server tells it from a brand-new device (digest open question Q2): it answers
  ``has_offline=false`` with an empty range, so the rebuilt device resumes at ``sync_to_seq``
  and ``(trim, sync_to_seq]`` is not pulled again (seed 003 M-7). Only the identity claims are
  checked: the token may be of an old epoch, which is why the device is rebuilding.
* any other valid cursor resumes at its ``last_applied_mailbox_seq``.

``has_offline`` comes from :class:`PendingSummary.has_entries`, which must be exact (or err
towards True): with ``has_offline=false`` the client may skip pulling, so it is a completeness
decision, and hints never take part in those (I-31). The two counts are estimates (B.3
``pending_hint_error_ratio``) that only steer the client's pull strategy (9.3.5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from qim.core.sync.cursor import (
    CursorClaims,
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
)
from qim.core.sync.progress import SyncProgress
from qim.schemas.frames import AuthOk, Error, MailboxCursor

__all__ = [
    "NOTHING_PENDING",
    "AuthSync",
    "BoundaryLookup",
    "CursorIdentity",
    "CursorKind",
    "PendingLookup",
    "PendingSummary",
    "check_auth_cursor",
]

_U32_MAX: Final = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class CursorIdentity:
    """Who AUTH authenticated and where that user's mailbox lives now (all server-derived)."""

    tenant_id: str
    user_id: str
    device_id: str
    mailbox_shard_id: int
    lane_id: int
    shard_epoch: int

    def claims(self, issued_at: int) -> CursorClaims:
        return CursorClaims(
            self.tenant_id,
            self.user_id,
            self.device_id,
            self.mailbox_shard_id,
            self.lane_id,
            self.shard_epoch,
            issued_at,
        )


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """The user's entries in ``(start, sync_to]``: ``has_entries`` exact, the counts estimates."""

    has_entries: bool
    entry_count_hint: int = 0
    bytes_hint: int = 0


NOTHING_PENDING: Final = PendingSummary(False)

PendingLookup = Callable[[int, int], PendingSummary]
"""``(after_seq, up_to_seq) -> PendingSummary`` over the user's mailbox range."""

BoundaryLookup = Callable[[CursorClaims, int], int | None]
"""``(old claims, last_applied) -> replay_from_seq`` from EpochBoundary / ShardSplitBoundary,
or None when the boundary is no longer resolvable. Must not return a seq above ``W[lane]``."""


class CursorKind(Enum):
    NEW_DEVICE = "new_device"
    REBUILD_HANDSHAKE = "rebuild_handshake"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class AuthSync:
    """The sync part of AUTH_OK, plus what the session needs to judge SYNC_COMPLETE."""

    kind: CursorKind
    lane_id: int
    lane_watermark: int
    trim_watermark: int
    sync_to_seq: int
    has_offline: bool
    pending_entry_count_hint: int
    pending_bytes_hint: int
    start_seq: int  # the exclusive lower end of the range this login must cover
    cursor_token: bytes  # signed for the current shard/epoch; AUTH_OK has no field for it yet

    def auth_ok(self, **fields: Any) -> AuthOk:
        """AUTH_OK with these sync fields; ``fields`` adds session_epoch, badges, hints..."""
        return AuthOk(
            lane_id=self.lane_id,
            lane_watermark=self.lane_watermark,
            trim_watermark=self.trim_watermark,
            sync_to_seq=self.sync_to_seq,
            has_offline=self.has_offline,
            pending_entry_count_hint=self.pending_entry_count_hint,
            pending_bytes_hint=self.pending_bytes_hint,
            **fields,
        )

    def progress(self) -> SyncProgress:
        """The per-session coverage record SYNC_COMPLETE is checked against."""
        return SyncProgress(self.start_seq, self.sync_to_seq, has_offline=self.has_offline)


def _foreign(claims: CursorClaims, identity: CursorIdentity) -> str:
    for name in ("tenant_id", "user_id", "device_id", "lane_id"):
        if getattr(claims, name) != getattr(identity, name):
            return f"cursor was issued for another {name.removesuffix('_id')}"
    return ""


def check_auth_cursor(
    cursor: MailboxCursor | None,
    *,
    identity: CursorIdentity,
    lane_watermark: int,
    trim_watermark: int,
    keys: CursorKeyRing,
    now_ms: int,
    resolve_boundary: BoundaryLookup,
    pending: PendingLookup,
) -> AuthSync | Error:
    """Run checks 1-4 of 9.3.1 for one AUTH; pure apart from the two lookups passed in."""
    w, trim = lane_watermark, trim_watermark

    def accept(kind: CursorKind, start: int) -> AuthSync:
        start = min(start, w)
        summary = pending(start, w) if start < w else NOTHING_PENDING
        return AuthSync(
            kind=kind,
            lane_id=identity.lane_id,
            lane_watermark=w,
            trim_watermark=trim,
            sync_to_seq=w,
            has_offline=summary.has_entries,
            pending_entry_count_hint=min(max(summary.entry_count_hint, 0), _U32_MAX),
            pending_bytes_hint=max(summary.bytes_hint, 0),
            start_seq=start,
            cursor_token=sign_cursor(identity.claims(now_ms), keys),
        )

    if cursor is None or not cursor.token:
        return accept(CursorKind.NEW_DEVICE, trim)
    try:
        claims = verify_cursor(cursor.token, keys)
    except CursorTokenError as exc:
        return cursor_invalid(f"cursor token rejected: {exc}")
    foreign = _foreign(claims, identity)
    if foreign:
        return cursor_invalid(foreign)
    seq = cursor.last_applied_mailbox_seq
    if seq == 0:
        return accept(CursorKind.REBUILD_HANDSHAKE, w)
    if seq > w:
        return cursor_invalid(f"last_applied_mailbox_seq {seq} is above W[lane] {w}")
    behind = claims.shard_epoch < identity.shard_epoch
    moved = claims.mailbox_shard_id != identity.mailbox_shard_id
    if claims.shard_epoch > identity.shard_epoch or (moved and not behind):
        return cursor_invalid("cursor names a shard or epoch this user does not have")
    if seq < trim:
        return cursor_expired(trim)
    if behind:
        replay_from = resolve_boundary(claims, seq)
        if replay_from is None or replay_from < trim:
            return cursor_expired(trim, "epoch boundary is no longer resolvable")
        if replay_from > w:
            raise SyncInvariantError(f"boundary replay_from_seq {replay_from} > W[lane] {w}")
        return cursor_rebased(sign_cursor(identity.claims(now_ms), keys), replay_from)
    return accept(CursorKind.RESUME, seq)
