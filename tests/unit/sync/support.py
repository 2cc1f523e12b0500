"""Builders for the login-sync tests: entries, an in-memory user mailbox, a server session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from qim.core.sync import (
    DEFAULT_PULL_LIMITS,
    AuthSync,
    CursorIdentity,
    CursorKey,
    CursorKeyRing,
    Group,
    PendingSummary,
    PullLimits,
    SyncProgress,
    check_auth_cursor,
    pull_mailbox,
)
from qim.schemas.frames import (
    Error,
    MailboxBatch,
    MailboxCursor,
    OnlineReady,
    PullMailbox,
    SyncComplete,
    SyncEntry,
    encode_body,
    u128_to_bytes,
)

KEY = CursorKey("k1", b"cursor-secret-one-0123456789abcd")
KEY2 = CursorKey("k2", b"cursor-secret-two-0123456789abcd")
RING = CursorKeyRing([KEY])
IDENTITY = CursorIdentity(
    tenant_id="t1", user_id="u42", device_id="phone", mailbox_shard_id=7, lane_id=15, shard_epoch=0
)
NOW = 1_800_000_000_000


def entry(seq: int, ordinal: int = 0, *, message: int | None = None, body: int = 0) -> SyncEntry:
    """One entry of the group at ``seq``; ``body`` octets of payload make it heavier."""
    mid = seq if message is None else message
    return SyncEntry(
        mailbox_seq=seq,
        event_ordinal=ordinal,
        event_id=(seq << 3) | ordinal,
        event_type=ordinal,
        message_id=u128_to_bytes(mid),
        conversation_id="g:team",
        conversation_seq=seq,
        sender_id="u7",
        body_included=body > 0,
        payload_or_ciphertext=b"x" * body if body else None,
    )


def group(seq: int, size: int = 1, *, body: int = 0) -> list[SyncEntry]:
    return [entry(seq, ordinal, body=body) for ordinal in range(size)]


def size_of(entries: list[SyncEntry]) -> int:
    return sum(len(encode_body(e)) for e in entries)


@dataclass
class Mailbox:
    """One user's mailbox as the MailboxNode would show it, with read bookkeeping."""

    groups: dict[int, list[SyncEntry]] = field(default_factory=dict)
    lane_watermark: int = 0
    trim_watermark: int = 0
    reads: list[tuple[int, int]] = field(default_factory=list)

    def add(self, seq: int, size: int = 1, *, body: int = 0) -> None:
        self.groups[seq] = group(seq, size, body=body)

    def read(self, after_seq: int, up_to_seq: int) -> Iterator[Group]:
        self.reads.append((after_seq, up_to_seq))
        for seq in sorted(self.groups):
            if after_seq < seq <= up_to_seq:
                yield seq, self.groups[seq]

    def entries_in(self, after_seq: int, up_to_seq: int) -> list[SyncEntry]:
        return [e for _, g in self.read(after_seq, up_to_seq) for e in g]

    def pending(self, after_seq: int, up_to_seq: int) -> PendingSummary:
        found = self.entries_in(after_seq, up_to_seq)
        return PendingSummary(bool(found), len(found), size_of(found))

    def pull(
        self, request: PullMailbox, limits: PullLimits = DEFAULT_PULL_LIMITS
    ) -> MailboxBatch | Error:
        return pull_mailbox(
            self.read,
            request,
            lane_watermark=self.lane_watermark,
            trim_watermark=self.trim_watermark,
            limits=limits,
        )


def no_boundary(claims: object, seq: int) -> int | None:
    raise AssertionError("the epoch boundary must not be consulted here")


@dataclass
class ServerSession:
    """The MailboxNode's share of one connection: AUTH, PULL_MAILBOX, SYNC_COMPLETE."""

    mailbox: Mailbox
    identity: CursorIdentity = IDENTITY
    ring: CursorKeyRing = RING
    progress: SyncProgress | None = None
    auth: AuthSync | None = None

    def authenticate(self, cursor: MailboxCursor | None) -> AuthSync | Error:
        result = check_auth_cursor(
            cursor,
            identity=self.identity,
            lane_watermark=self.mailbox.lane_watermark,
            trim_watermark=self.mailbox.trim_watermark,
            keys=self.ring,
            now_ms=NOW,
            resolve_boundary=no_boundary,
            pending=self.mailbox.pending,
        )
        if isinstance(result, AuthSync):
            self.auth, self.progress = result, result.progress()
        return result

    def pull(
        self, request: PullMailbox, limits: PullLimits = DEFAULT_PULL_LIMITS
    ) -> MailboxBatch | Error:
        batch = self.mailbox.pull(request, limits)
        if isinstance(batch, MailboxBatch) and self.progress is not None:
            self.progress.record(request.after_seq, batch.covered_through_seq)
        return batch

    def complete(self, request: SyncComplete) -> OnlineReady | Error:
        assert self.progress is not None
        return self.progress.complete(request)
