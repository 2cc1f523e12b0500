"""The ERROR frames login sync answers with (A.6 rows 1, 2, 3, 5, 6), built in one place.

Why constructors instead of ``Error(...)`` at each call site: every code carries exactly the
extras A.6 declares for it (``errors.for_code(c).extras``) and nothing else, so a reply can be
checked field by field, and ``rebuild_required`` is always ``True`` on CURSOR_EXPIRED (9.3 check
2: a stale cursor is never softened into anything the client may ignore).

These are the *peer's* errors. A broken invariant of ours (a reader handing back groups outside
the requested range, a boundary lookup pointing above ``W[lane]``) raises
:class:`SyncInvariantError` instead: a bug of ours is never reported as the client's fault
(style.md item 4). ``request_id`` is left 0; the gateway sets it from the request header.
"""

from __future__ import annotations

from qim.schemas.frames import Error, ErrorCode

__all__ = [
    "SyncInvariantError",
    "cursor_expired",
    "cursor_invalid",
    "cursor_rebased",
    "shard_moved",
    "sync_incomplete",
]


class SyncInvariantError(RuntimeError):
    """Input from our own side broke a sync invariant: alert and close, never blame the peer."""


def cursor_invalid(detail: str) -> Error:
    """CURSOR_INVALID: bad signature, foreign claims, or a seq above ``W[lane]`` (6.8, 9.3.2)."""
    return Error(code=int(ErrorCode.CURSOR_INVALID), detail=detail)


def cursor_expired(trim_watermark: int, detail: str = "") -> Error:
    """CURSOR_EXPIRED{trim_watermark, rebuild_required=true}: go to the 9.6 REBUILD."""
    return Error(
        code=int(ErrorCode.CURSOR_EXPIRED),
        detail=detail or f"cursor is below the trim watermark {trim_watermark}",
        trim_watermark=trim_watermark,
        rebuild_required=True,
    )


def cursor_rebased(new_cursor: bytes, replay_from_seq: int) -> Error:
    """CURSOR_REBASED{new_cursor, replay_from_seq}: re-issued token, replay with dedup (5.5.3)."""
    return Error(
        code=int(ErrorCode.CURSOR_REBASED),
        detail="shard_epoch moved; cursor re-issued at the epoch boundary",
        new_cursor=new_cursor,
        replay_from_seq=replay_from_seq,
    )


def sync_incomplete(detail: str) -> Error:
    """SYNC_INCOMPLETE: the barrier stays, the client keeps pulling (9.3.4)."""
    return Error(code=int(ErrorCode.SYNC_INCOMPLETE), detail=detail)


def shard_moved(retry_after_ms: int) -> Error:
    """SHARD_MOVED: the lane is still below ``W_floor`` after a takeover (direction.md 4.1)."""
    return Error(
        code=int(ErrorCode.SHARD_MOVED),
        detail="lane is catching up after a takeover",
        retry_after_ms=retry_after_ms,
    )
