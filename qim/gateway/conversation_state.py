"""CONVERSATION_STATE [ext] -> the fields of a ``UserStateRequest`` (spec 12.9), or a refusal.

Why checked at the gateway: the MailboxNode appends whatever it is given to the shard log, and
the log is replayed forever, so a malformed id or a policy no build understands is refused
before it leaves (ERROR{PERMISSION_DENIED}, as a malformed conversation id of a routed frame
is). Only the fields the action uses are carried: ``flag`` for mute / archive, ``pin_rank``
for pin (None = unpin), ``notification_policy`` for its own action. Identity never comes from
here: the caller takes it from the session's grant.
"""

from __future__ import annotations

from typing import TypedDict

from qim.core.conversation.ids import conversation_kind
from qim.schemas.frames import Error, ErrorCode
from qim.schemas.frames.control import (
    CONVERSATION_STATE_ACTIONS,
    NOTIFICATION_POLICIES,
    ConversationState,
)

__all__ = ["StateFields", "refused", "state_fields"]


class StateFields(TypedDict):
    """The ``UserStateRequest`` fields a CONVERSATION_STATE frame contributes."""

    conversation_id: str
    action: str
    flag: bool
    pin_rank: int | None
    notification_policy: str


def state_fields(body: ConversationState) -> StateFields | str:
    """The request fields, or why the frame is refused (the ERROR's ``detail``)."""
    action = body.action
    if action not in CONVERSATION_STATE_ACTIONS:
        return f"unknown conversation state action {action!r}"
    if conversation_kind(body.conversation_id) is None:
        return "malformed conversation_id"
    policy = body.notification_policy if action == "notification_policy" else ""
    if action == "notification_policy" and policy not in NOTIFICATION_POLICIES:
        return f"unknown notification_policy {policy!r}"
    return StateFields(
        conversation_id=body.conversation_id,
        action=action,
        flag=body.flag if action in ("mute", "archive") else False,
        pin_rank=body.pin_rank if action == "pin" else None,
        notification_policy=policy,
    )


def refused(detail: str, request_id: int) -> Error:
    """ERROR{PERMISSION_DENIED} echoing the frame's request_id."""
    return Error(code=int(ErrorCode.PERMISSION_DENIED), detail=detail, request_id=request_id)
