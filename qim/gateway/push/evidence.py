"""PUSHED / APPLIED evidence and CONN_CLOSED, ConnectionNode -> MailboxShard (16.1.2, INV-50).

What the MailboxNode's second check needs from the gateway, and nothing more:

* PUSHED: a PUSH_EVENTS frame of ``mailbox_seq`` S left this connection's send buffer into
  the socket (the driver measured it, :mod:`~qim.gateway.transport.sendbuf`); only the maximum
  per device is kept;
* DELIVERED: the peer's TCP acknowledged everything written up to a PUSHED frame (the
  kernel's send queue is empty, ``SIOCOUTQ``), checked each flush for the connections that
  have PUSHED frames not yet known delivered;
* APPLIED: the device's ``PING.last_applied_mailbox_seq`` / ``PULL_MAILBOX.acked_seq``,
  reported only when it grows (a PING repeats the same cursor every beat);
* CONN_CLOSED{device_id, session_epoch, last_pushed_user_seq}: on every close path of an
  authenticated connection, sent at once (not batched), carrying the device's evidence still
  buffered, so the MailboxNode never sees a close overtaken by its own evidence.

Batched: evidence is coalesced per (tenant, user, device, session_epoch) and flushed every
``flush_ms`` as one :class:`~qim.schemas.records.push.PushEvidence` per (tenant, MailboxShard)
on ``qim.user-requests`` at the explicit partition of the user's MailboxShard (16.1.2 / the
Faust notes: APPLIED is high volume, coalesce per device, send only increases). Records go
through the router's forwarder like PRESENCE_STALE; a full queue or a failed send loses a hint,
which costs at most one extra push.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from qim.schemas.records.push import (
    ConnClosed,
    DeviceEvidence,
    PushEvidence,
    encode_push_record,
)

__all__ = ["EvidenceReporter"]

log = logging.getLogger(__name__)

_Session = tuple[str, str, str, int]  # tenant, user, device, session_epoch


@dataclass(frozen=True, slots=True)
class _Out:
    """A record as the forwarder's ``Outgoing``."""

    record: PushEvidence | ConnClosed

    @property
    def key(self) -> bytes:
        return self.record.key

    @property
    def value(self) -> bytes:
        return encode_push_record(self.record)

    @property
    def partition(self) -> int:
        return self.record.partition


class EvidenceReporter:
    """Coalesces evidence per device session and flushes it (module doc)."""

    def __init__(
        self,
        submit: Callable[[_Out], bool],
        mailbox_shard_of: Callable[[str, str], int],
        registry: CollectorRegistry,
        *,
        flush_ms: int = 250,
    ) -> None:
        self._submit = submit
        self._shard_of = mailbox_shard_of
        self.flush_ms = flush_ms
        self._pending: dict[_Session, list[int]] = {}  # [pushed, applied, delivered] unsent
        self._reported: dict[_Session, list[int]] = {}  # [pushed, applied, delivered] sent
        self.sent = Counter(
            "push_evidence_records",
            "Second-check records the ConnectionNode sent to the MailboxShards (16.1.2), by "
            "kind (push_evidence, conn_closed) and outcome (queued, dropped).",
            ["kind", "outcome"],
            registry=registry,
        )

    def pushed(self, session: _Session, mailbox_seq: int) -> None:
        self._note(session, 0, mailbox_seq)

    def applied(self, session: _Session, mailbox_seq: int) -> None:
        self._note(session, 1, mailbox_seq)

    def delivered(self, session: _Session, mailbox_seq: int) -> None:
        self._note(session, 2, mailbox_seq)

    def _note(self, session: _Session, index: int, seq: int) -> None:
        if seq <= 0:
            return
        reported = self._reported.setdefault(session, [0, 0, 0])
        if seq <= reported[index]:
            return
        reported[index] = seq
        pending = self._pending.setdefault(session, [0, 0, 0])
        pending[index] = max(pending[index], seq)

    def closed(self, session: _Session, *, last_pushed_user_seq: int, connection_id: str,
               reason: str, sync_to_seq: int = 0) -> None:  # fmt: skip
        """CONN_CLOSED now, with the device's freshest APPLIED (module doc). Everything else
        pending is flushed first, so on the shard's partition the close follows all evidence
        this node saw before it (another device's APPLIED included)."""
        tenant, user, device, epoch = session
        self._pending.pop(session, None)
        self.flush()
        reported = self._reported.pop(session, [0, 0, 0])
        record = ConnClosed(
            tenant_id=tenant,
            user_id=user,
            device_id=device,
            session_epoch=epoch,
            last_pushed_user_seq=last_pushed_user_seq,
            applied_seq=reported[1],
            sync_to_seq=sync_to_seq,
            connection_id=connection_id,
            reason=reason,
            mailbox_shard=self._shard_of(tenant, user),
        )
        self._send(record, "conn_closed")

    def flush(self) -> int:
        """One PushEvidence per (tenant, shard) of everything pending; returns how many."""
        pending, self._pending = self._pending, {}
        groups: dict[tuple[str, int], list[DeviceEvidence]] = {}
        for (tenant, user, device, epoch), (pushed, applied, delivered) in sorted(pending.items()):
            groups.setdefault((tenant, self._shard_of(tenant, user)), []).append(
                DeviceEvidence(
                    user_id=user,
                    device_id=device,
                    session_epoch=epoch,
                    pushed_seq=pushed,
                    applied_seq=applied,
                    delivered_seq=delivered,
                )
            )
        for (tenant, shard), devices in groups.items():
            record = PushEvidence(tenant_id=tenant, mailbox_shard=shard, devices=tuple(devices))
            self._send(record, "push_evidence")
        return len(groups)

    def _send(self, record: PushEvidence | ConnClosed, kind: str) -> None:
        queued = self._submit(_Out(record))
        self.sent.labels(kind, "queued" if queued else "dropped").inc()
