"""Why a membership request was refused, and how a broken log is reported.

:class:`MembershipRejected` is a ``ProtocolError`` that keeps the connection open, so the gateway
answers with ``ERROR{code, detail}`` (App. A.6) through the same path as every other refusal.
PERMISSION_DENIED is the default: A.3 makes a non-member and a non-existent group
indistinguishable on LEAVE_GROUP, and B.6.1 says over-limit creates/joins are rejected whole.
:class:`MembershipLogError` is never the client's fault: the outbox holds a record that cannot
follow the state (a gap, a foreign or corrupt log), and the consumer must stop, not skip.
"""

from __future__ import annotations

from typing import ClassVar

from qim.schemas.frames.errors import ErrorCode
from qim.schemas.frames.exceptions import ProtocolError

__all__ = ["MembershipLogError", "MembershipRejected"]


class MembershipRejected(ProtocolError):
    """A create/add/remove/leave/pull that must not happen; nothing was committed."""

    error_code: ClassVar[ErrorCode | None] = ErrorCode.PERMISSION_DENIED
    close: ClassVar[bool] = False


class MembershipLogError(ValueError):
    """A record that cannot follow the current state: a gap, a foreign or corrupt log."""
