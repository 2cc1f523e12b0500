"""User requests (gateway -> MailboxNode) and the MailboxNode's replies (-> gateway).

Topics (direction.md section 3):

* ``qim.user-requests``: key :func:`~qim.schemas.records.requests.user_key` ``(tenant,
  user_id)``, **explicit partition** = the user's MailboxShard (:func:`mailbox_partition`), so
  the request reaches the worker that owns the shard's dispatch partition: the same group
  assignment decides both (direction.md 4.1). Reads (auth sync, pull mailbox, pull session
  list), the gateway's :class:`~qim.schemas.records.push.PresenceStale`
  (``kind="presence_stale"``), its 16.1.2 evidence (``push_evidence``, ``conn_closed``) and
  :class:`UserStateRequest` (MARK_READ ...), which the owner
  does not apply: it appends it to the shard's dispatch partition as a ``UserStateCommand``.
* ``qim.to-gateway``: :class:`MailboxReply` at **explicit partition** = ``connection_shard``,
  key ``(tenant, user_id)``, next to the ConversationWriter's ``WriterReply`` (``kind="reply"``)
  and the PushBatch (``kind="push_batch"``).

Wire shape of the reply (msgpack map, defaults omitted, unknown keys ignored)::

    MailboxReply  kind="mailbox_reply"
      tenant_id, user_id, device_id: str     the session the request came from
      session_epoch: u64                     the gateway drops a reply for a replaced session
      connection_shard: u32                  = the to-gateway partition
      request_id: u32                        echo of the request's frame request_id
      correlation_id: str                    echo; the gateway's handle of a pending login
      mailbox_shard: u32                     the shard that answered
      exactly one of:
        auth_sync: AuthSyncResult            answer to SyncAuthRequest (AUTH_OK sync fields)
        mailbox_batch: MailboxBatch          answer to PullMailboxRequest (MAILBOX_BATCH body)
        session_list: SessionListBatch       answer to PullSessionListRequest (SESSION_LIST_BATCH)
        error: Error                         CURSOR_INVALID / CURSOR_EXPIRED / CURSOR_REBASED /
                                             SHARD_MOVED{retry_after_ms} (ERROR body)

:class:`AuthSyncResult` carries the AUTH_OK fields of spec 9.3.1 plus what the gateway's
session needs for the SYNC_COMPLETE barrier (``start_seq``, ``qim.core.sync.SyncProgress``).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import msgspec

from qim.schemas.frames.base import I32, U8, U32, U64
from qim.schemas.frames.connection import AuthOk, Error, MailboxCursor
from qim.schemas.frames.history import PullSessionList, SessionListBatch
from qim.schemas.frames.mailbox import MailboxBatch, PullMailbox
from qim.schemas.records.push import ConnClosed, PresenceStale, PushBatch, PushEvidence
from qim.schemas.records.requests import WriterReply, user_key
from qim.schemas.routing import mailbox_shard_id, user_bucket

__all__ = [
    "AuthSyncResult",
    "GatewayBoundRecord",
    "MailboxReply",
    "PullMailboxRequest",
    "PullSessionListRequest",
    "SyncAuthRequest",
    "UserRequest",
    "UserStateRequest",
    "decode_gateway_bound",
    "decode_mailbox_reply",
    "decode_user_request",
    "encode_user_record",
    "mailbox_partition",
]


class _Record(
    msgspec.Struct,
    kw_only=True,
    omit_defaults=True,
    frozen=True,
    forbid_unknown_fields=False,
    tag_field="kind",
):
    """Tagged msgpack map, like ``requests._Record``: one topic may carry several kinds."""


class _FromSession(_Record, kw_only=True, frozen=True):
    """Who asked (from the authenticated session, never from a frame) and where the reply goes;
    the same fields as ``requests._FromSession`` plus the gateway's ``correlation_id``."""

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32 = 0
    correlation_id: str = ""

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)


def mailbox_partition(
    tenant_id: str, user_id: str, *, virtual_bucket_count: int, mailbox_shard_count: int
) -> int:
    """The explicit user-requests partition: the user's MailboxShard (spec 5.2 mask mapping)."""
    bucket = user_bucket(tenant_id, user_id, virtual_bucket_count)
    return mailbox_shard_id(bucket, mailbox_shard_count)


class SyncAuthRequest(_FromSession, tag="sync_auth", kw_only=True, frozen=True):
    """The mailbox half of a login (9.3.1): the AUTH frame's cursor, once AuthService accepted.

    ``cursor`` is the AUTH frame's ``mailbox_cursor`` unchanged (None or an empty token: a new
    device, 9.6.1). Answered with ``MailboxReply.auth_sync`` or ``.error``.
    """

    cursor: MailboxCursor | None = None


class PullMailboxRequest(_FromSession, tag="pull_mailbox", kw_only=True, frozen=True):
    """PULL_MAILBOX (A.3 #2) with the session's identity; answered with ``.mailbox_batch``."""

    message: PullMailbox


class PullSessionListRequest(_FromSession, tag="pull_session_list", kw_only=True, frozen=True):
    """PULL_SESSION_LIST (A.3) with the session's identity; answered with ``.session_list``."""

    message: PullSessionList


class UserStateRequest(_FromSession, tag="user_state", kw_only=True, frozen=True):
    """A user's own state change (MARK_READ, mark unread, clear history, delete, pin, mute,
    archive; 12.9): the owning MailboxNode appends it to the shard log as a
    ``UserStateCommand`` and materializes it from there. No reply (fire and forget: the
    result arrives as READ_SYNC / SESSION_DELTA / BADGE_UPDATE and the CONTROL entry)."""

    conversation_id: str
    action: str
    read_conversation_seq: U64 = 0
    flag: bool = False
    pin_rank: I32 | None = None
    notification_policy: str = ""


UserRequest: TypeAlias = (
    SyncAuthRequest
    | PullMailboxRequest
    | PullSessionListRequest
    | UserStateRequest
    | PresenceStale
    | PushEvidence
    | ConnClosed
)
"""Every kind of ``qim.user-requests``. Add a kind here; deploy consumers first."""


class AuthSyncResult(
    msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True, forbid_unknown_fields=False
):
    """The sync part of AUTH_OK (A.4 #1, 9.3.1) and the session's barrier inputs.

    ``kind`` is ``new_device`` / ``rebuild_handshake`` / ``resume`` (``qim.core.sync.CursorKind``
    values, plain str so a newer kind still decodes). ``start_seq`` is the exclusive lower end
    of the range this login must cover: the gateway builds ``SyncProgress(start_seq,
    sync_to_seq, has_offline=has_offline)``. ``mailbox_cursor_token`` goes to AUTH_OK's field of
    the same name; the device presents it in its next AUTH.
    """

    kind: str
    lane_id: U8
    lane_watermark: U64
    trim_watermark: U64 = 0
    sync_to_seq: U64
    has_offline: bool = False
    pending_entry_count_hint: U32 = 0
    pending_bytes_hint: U64 = 0
    start_seq: U64 = 0
    mailbox_cursor_token: bytes = b""
    shard_epoch: U64 = 0
    total_unread: U32 = 0
    total_mention: U32 = 0
    muted_unread: U32 = 0
    badge_projection_mailbox_seq: U64 = 0
    projection_complete: bool = False

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
            mailbox_cursor_token=self.mailbox_cursor_token,
            total_unread=self.total_unread,
            total_mention=self.total_mention,
            muted_unread=self.muted_unread,
            badge_projection_mailbox_seq=self.badge_projection_mailbox_seq,
            projection_complete=self.projection_complete,
            **fields,
        )


class MailboxReply(_Record, tag="mailbox_reply", kw_only=True, frozen=True):
    """A MailboxNode answer for the gateway owning ``connection_shard`` (see the module doc).

    Exactly one of ``auth_sync`` / ``mailbox_batch`` / ``error`` is set (checked on
    construction and on decode).
    """

    tenant_id: str
    user_id: str
    device_id: str
    session_epoch: U64
    connection_shard: U32
    request_id: U32 = 0
    correlation_id: str = ""
    mailbox_shard: U32 = 0
    auth_sync: AuthSyncResult | None = None
    mailbox_batch: MailboxBatch | None = None
    error: Error | None = None
    session_list: SessionListBatch | None = None

    def __post_init__(self) -> None:
        bodies = (self.auth_sync, self.mailbox_batch, self.error, self.session_list)
        if sum(b is not None for b in bodies) != 1:
            raise ValueError(
                "a MailboxReply carries exactly one of auth_sync, mailbox_batch, session_list,"
                " error"
            )

    @property
    def body(self) -> AuthSyncResult | MailboxBatch | SessionListBatch | Error:
        for b in (self.auth_sync, self.mailbox_batch, self.session_list, self.error):
            if b is not None:
                return b
        raise AssertionError("unreachable: checked in __post_init__")

    @property
    def key(self) -> bytes:
        return user_key(self.tenant_id, self.user_id)

    @property
    def partition(self) -> int:
        """The explicit to-gateway partition: the requester's ConnectionShard."""
        return self.connection_shard


GatewayBoundRecord: TypeAlias = WriterReply | PushBatch | MailboxReply
"""Every kind on ``qim.to-gateway`` today (``push.ToGatewayRecord`` plus this reply); defined
here because ``push`` cannot import this module (it would be circular)."""

_ENCODER: Final = msgspec.msgpack.Encoder()
_REQUESTS: msgspec.msgpack.Decoder[UserRequest] = msgspec.msgpack.Decoder(UserRequest)
_REPLY: Final = msgspec.msgpack.Decoder(MailboxReply)
_GATEWAY: msgspec.msgpack.Decoder[GatewayBoundRecord] = msgspec.msgpack.Decoder(GatewayBoundRecord)


def encode_user_record(
    record: SyncAuthRequest
    | PullMailboxRequest
    | PullSessionListRequest
    | UserStateRequest
    | MailboxReply,
) -> bytes:
    """msgpack bytes of a request or reply (deterministic: struct field order)."""
    return _ENCODER.encode(record)


def decode_user_request(data: bytes) -> UserRequest:
    """Decode a ``qim.user-requests`` value; raises ``msgspec.ValidationError`` if malformed."""
    return _REQUESTS.decode(data)


def decode_mailbox_reply(data: bytes) -> MailboxReply:
    """Decode a ``kind="mailbox_reply"`` value of ``qim.to-gateway``."""
    return _REPLY.decode(data)


def decode_gateway_bound(data: bytes) -> GatewayBoundRecord:
    """Decode any ``qim.to-gateway`` value (writer reply, PushBatch or mailbox reply)."""
    return _GATEWAY.decode(data)
