"""The ConnectionNode's 16.1.2 evidence: coalesced per device, increases only, CONN_CLOSED."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from qim.gateway.push.evidence import EvidenceReporter
from qim.schemas.records.push import ConnClosed, PushEvidence
from qim.schemas.records.user_requests import decode_user_request

PHONE = ("t", "alice", "phone", 3)
DESKTOP = ("t", "alice", "desktop", 5)


def _reporter() -> tuple[EvidenceReporter, list[Any]]:
    sent: list[Any] = []

    def submit(out: Any) -> bool:
        sent.append((out.partition, decode_user_request(out.value)))
        return True

    shards = {"alice": 1, "bob": 0}
    return EvidenceReporter(submit, lambda _t, u: shards[u], CollectorRegistry()), sent


def test_evidence_is_coalesced_per_device_and_sent_at_the_users_shard() -> None:
    reporter, sent = _reporter()
    reporter.pushed(DESKTOP, 10)
    reporter.pushed(DESKTOP, 20)
    reporter.applied(DESKTOP, 10)
    reporter.applied(PHONE, 7)
    assert sent == []  # batched until the flush
    assert reporter.flush() == 1
    [(partition, record)] = sent
    assert partition == 1 and isinstance(record, PushEvidence)
    assert [
        (d.device_id, d.session_epoch, d.pushed_seq, d.applied_seq) for d in record.devices
    ] == [
        ("desktop", 5, 20, 10),
        ("phone", 3, 0, 7),
    ]


def test_only_increases_are_reported_again() -> None:
    reporter, sent = _reporter()
    reporter.applied(DESKTOP, 10)
    reporter.flush()
    reporter.applied(DESKTOP, 10)  # the same cursor on the next PING
    assert reporter.flush() == 0
    reporter.applied(DESKTOP, 11)
    reporter.flush()
    assert [r.devices[0].applied_seq for _, r in sent] == [10, 11]


def test_conn_closed_goes_at_once_and_carries_the_buffered_applied() -> None:
    reporter, sent = _reporter()
    reporter.pushed(DESKTOP, 30)
    reporter.applied(DESKTOP, 20)
    reporter.closed(DESKTOP, last_pushed_user_seq=30, connection_id="c1", reason="peer_closed")
    [(partition, record)] = sent
    assert partition == 1 and isinstance(record, ConnClosed)
    assert (record.device_id, record.session_epoch) == ("desktop", 5)
    assert (record.last_pushed_user_seq, record.applied_seq) == (30, 20)
    assert reporter.flush() == 0  # its evidence rode the close, nothing trails behind it


def test_a_close_flushes_the_other_devices_evidence_before_itself() -> None:
    reporter, sent = _reporter()
    reporter.applied(PHONE, 7)
    reporter.closed(DESKTOP, last_pushed_user_seq=0, connection_id="c2", reason="peer_closed")
    assert [type(r).__name__ for _, r in sent] == ["PushEvidence", "ConnClosed"]
