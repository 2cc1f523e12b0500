"""The login barrier of one session (§9.3.4): AUTH_OK's sync fields, what was served, the verdict.

Why here and not on the MailboxNode: its PULL_MAILBOX answers are stateless (each request stands
alone, ``qim.core.sync.paging``) and a user's pulls may even be answered by two owners across a
takeover, while every MAILBOX_BATCH of this session passes through the ConnectionNode that holds
the socket. So the session records each served range here, and SYNC_COMPLETE is decided here
without another Kafka round trip: ONLINE_READY iff the ``sync_to_seq`` matches AUTH_OK's and
the served ranges cover ``(start_seq, sync_to_seq]`` contiguously (I-21, T30), else
``ERROR{SYNC_INCOMPLETE}`` and the barrier stays (the connection too: the client keeps pulling,
A.6 KEEP_PULLING).

What a range is: the request's ``after_seq`` (the gateway sent it, so the reply carries it back
in its ``correlation_id``, see ``mailbox_requests``) up to the batch's ``covered_through_seq``,
which the MailboxNode computed under 9.3.3's rules. Nothing a client writes can widen it.

Pure (style.md item 1): values in, :mod:`~qim.gateway.actions` out; the driver applies them.
"""

from __future__ import annotations

from typing import Final

import msgspec

from qim.core.sync import DEFAULT_MAX_PENDING_RANGES, SyncProgress
from qim.gateway.actions import Action, Count, Send
from qim.schemas.frames import AuthOk, Error, MailboxBatch, OnlineReady, SyncComplete, for_code
from qim.schemas.records.user_requests import AuthSyncResult

__all__ = ["LoginBarrier", "reply_error"]

_BATCH: Final = "mailbox_batch"
_COMPLETE: Final = "sync_complete"


def reply_error(error: Error, request_id: int) -> Error:
    """The ERROR as the client gets it: the request's id in the body too (A.4 #21)."""
    if error.request_id or not request_id:
        return error
    return msgspec.structs.replace(error, request_id=request_id)


class LoginBarrier:
    """One session's login sync: built from the MailboxNode's AUTH answer, then fed batches."""

    __slots__ = ("progress", "result")

    def __init__(
        self, result: AuthSyncResult, *, max_pending_ranges: int = DEFAULT_MAX_PENDING_RANGES
    ) -> None:
        self.result = result
        self.progress = SyncProgress(
            result.start_seq,
            result.sync_to_seq,
            has_offline=result.has_offline,
            max_pending_ranges=max_pending_ranges,
        )

    @property
    def released(self) -> bool:
        """ONLINE_READY was sent: realtime pushes may flow (§9.4.1)."""
        return self.progress.released

    @property
    def sync_to_seq(self) -> int:
        return self.result.sync_to_seq

    def auth_ok(self, **fields: object) -> AuthOk:
        """AUTH_OK with the MailboxNode's sync fields (lane, watermarks, hints, cursor token)."""
        return self.result.auth_ok(**fields)

    def served(
        self,
        request_id: int,
        after_seq: int | None,
        body: AuthSyncResult | MailboxBatch | Error,
        version: int,
    ) -> list[Action]:
        """A MailboxReply to one of this session's PULL_MAILBOX frames, as frames to write.

        ``after_seq`` None: the reply's correlation did not say (a foreign or old producer);
        the batch still reaches the client but counts for nothing, so at worst SYNC_COMPLETE
        asks for that range again.
        """
        if isinstance(body, MailboxBatch):
            if after_seq is not None:
                self.progress.record(after_seq, body.covered_through_seq)
            label = "entries" if body.entries else "empty"
            return [Count(_BATCH, label), Send(body, request_id=request_id, version=version)]
        if isinstance(body, Error):
            error = reply_error(body, request_id)
            return [
                Count(_BATCH, for_code(error.code).name.lower()),
                Send(error, request_id=request_id, version=version),
            ]
        return [Count(_BATCH, "mismatched_reply")]  # an AUTH answer for a pull: a bug upstream

    def complete(self, request_id: int, request: SyncComplete, version: int) -> list[Action]:
        """SYNC_COMPLETE -> ONLINE_READY or ERROR{SYNC_INCOMPLETE}; repeating it is harmless."""
        verdict = self.progress.complete(request)
        if isinstance(verdict, OnlineReady):
            return [
                Count(_COMPLETE, "online_ready"),
                Send(verdict, request_id=request_id, version=version),
            ]
        return [
            Count(_COMPLETE, "sync_incomplete"),
            Send(reply_error(verdict, request_id), request_id=request_id, version=version),
        ]
