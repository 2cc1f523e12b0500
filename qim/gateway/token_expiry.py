"""Access-token expiry on an open connection (§15.3.1, INV-48, AT-94): pure, time as an argument.

Why: an open connection is never proof of authorization (§20/§22). Once the grant's
``token_expires_at_ms`` has passed, the connection is in the ``token_expiry_grace`` read-only
period: reads pass, writes get ``ERROR{TOKEN_EXPIRED}`` with their request_id; once the grace
has ended without a silent re-AUTH (which moves the expiry), the server sends
``ERROR{TOKEN_EXPIRED}`` and closes. A grant with no known expiry (None) never expires here.

Phases (the authenticator's rule: a token is valid while ``now < exp``, so ``exp`` itself is
already expired)::

    now < exp                      VALID    as before
    exp <= now <= exp + grace      GRACE    reads pass, writes -> ERROR{TOKEN_EXPIRED}
    exp + grace < now              EXPIRED  ERROR{TOKEN_EXPIRED} + close, whatever the frame
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from qim.schemas.frames import Body, Error, ErrorCode, MediaTicket, spec_for_model

__all__ = [
    "READ_FRAMES",
    "WRITE_FRAMES",
    "TokenPhase",
    "close_at_ms",
    "expired_error",
    "is_write",
    "token_phase",
]

# Every state-changing uplink of the opcode table (qim/schemas/frames/opcodes.py), or one that
# sends something to other users: §15.3.1 names SEND_MESSAGE, MARK_READ, RECALL, EDIT; the
# rest follow its purpose ("users can still receive messages, just not send"):
# CONVERSATION_STATE [ext] (pin/mute/archive), CREATE_GROUP / LEAVE_GROUP (membership),
# REACT, PREKEY_PUBLISH (the device's key bundle), PREKEY_FETCH (it consumes one of the target
# device's one-time prekeys: a lapsed session must not drain them), TYPING and RTC_SIGNAL
# (reach other users),
# MEDIA_TICKET (an upload ticket; ``intent="download"`` is a read, see :func:`is_write`).
WRITE_FRAMES: Final[frozenset[str]] = frozenset(
    {
        "SEND_MESSAGE",
        "MARK_READ",
        "RECALL",
        "EDIT",
        "CONVERSATION_STATE",
        "CREATE_GROUP",
        "LEAVE_GROUP",
        "REACT",
        "PREKEY_PUBLISH",
        "PREKEY_FETCH",
        "TYPING",
        "RTC_SIGNAL",
        "MEDIA_TICKET",
    }
)

# The uplinks that only receive or subscribe: allowed during the grace. AUTH is neither (it is
# the renewal itself). A unit test checks both sets cover every uplink of the table.
READ_FRAMES: Final[frozenset[str]] = frozenset(
    {
        "PING",
        "PULL_MAILBOX",
        "SYNC_COMPLETE",
        "PULL_HISTORY",
        "PULL_SESSION_LIST",
        "PRESENCE_SUB",
        "ROOM_JOIN",
        "ROOM_LEAVE",
        "ROOM_REPLAY",
        "PULL_REACTIONS",
        "PULL_MEMBERS",
    }
)


class TokenPhase(Enum):
    VALID = "valid"
    GRACE = "grace"
    EXPIRED = "expired"


def token_phase(expires_at_ms: int | None, grace_ms: int, now_ms: int) -> TokenPhase:
    """Where ``now_ms`` falls against the token's expiry (module doc)."""
    if expires_at_ms is None or now_ms < expires_at_ms:
        return TokenPhase.VALID
    if now_ms <= expires_at_ms + grace_ms:
        return TokenPhase.GRACE
    return TokenPhase.EXPIRED


def close_at_ms(expires_at_ms: int | None, grace_ms: int) -> int | None:
    """The first instant of EXPIRED: the idle connection's close deadline (None: never)."""
    return None if expires_at_ms is None else expires_at_ms + grace_ms + 1


def is_write(body: Body) -> bool:
    """True for a frame the grace rejects; anything not in :data:`WRITE_FRAMES` passes."""
    if isinstance(body, MediaTicket):
        return body.intent != "download"
    return spec_for_model(type(body)).name in WRITE_FRAMES


def expired_error(request_id: int, detail: str) -> Error:
    """ERROR{TOKEN_EXPIRED}; A.6 tells the client to refresh and reconnect (or re-AUTH)."""
    return Error(code=int(ErrorCode.TOKEN_EXPIRED), detail=detail, request_id=request_id)
