"""Spec 7.2 / 8.3 ClientDedup: the same SEND_ACK within the window, expiry by log time."""

from __future__ import annotations

from qim.core.conversation import Accepted, ClientDedup, DedupEntry, Duplicate

from .support import NOW, Groups, accepted, commit, config, direct_request, writer

TTL_MS = 7200 * 1000


def _entry(at: int, seq: int = 1) -> DedupEntry:
    return DedupEntry("g:x", bytes(16), seq, bytes(16), at)


def test_8_3_duplicate_returns_the_identical_send_ack() -> None:
    state = writer()
    first = accepted(commit(state, direct_request("alice", "bob", "cm-7", request_id=1)))
    before = state.snapshot()
    retry = state.handle_send(direct_request("alice", "bob", "cm-7", request_id=2), NOW, Groups())
    assert isinstance(retry, Duplicate)
    original, replayed = first.reply.send_ack, retry.reply.send_ack
    assert original is not None and replayed is not None
    # identical except request_id, which is connection-scoped and echoes the new request (8.4)
    assert (
        replayed.client_message_id,
        replayed.message_id,
        replayed.conversation_seq,
        replayed.last_activity_id,
    ) == (
        original.client_message_id,
        original.message_id,
        original.conversation_seq,
        original.last_activity_id,
    )
    assert replayed.request_id == 2
    assert state.snapshot() == before  # no new seq, no token, nothing


def test_8_3_dedup_survives_replay_and_a_new_writer_incarnation() -> None:
    from qim.core.conversation import replay

    state = writer()
    first = accepted(commit(state, direct_request("alice", "bob", "cm-1")))
    rebuilt = replay([first.record], config(), region_id=2, writer_id=9, fencing_epoch=2)
    retry = rebuilt.handle_send(direct_request("alice", "bob", "cm-1"), NOW + 60_000, Groups())
    assert isinstance(retry, Duplicate)
    assert retry.reply.send_ack is not None
    assert retry.reply.send_ack.message_id == first.record.message_id


def test_7_2_window_is_measured_in_log_time_not_read_time() -> None:
    state = writer()
    first = accepted(commit(state, direct_request("alice", "bob", "old")))
    # three hours of wall clock but no record committed since: still a duplicate
    later = state.handle_send(direct_request("alice", "bob", "old"), NOW + 3 * 3600_000, Groups())
    assert isinstance(later, Duplicate)
    # a record committed just under the TTL later keeps it; one at the TTL expires it
    commit(state, direct_request("carol", "dave", "x"), NOW + TTL_MS - 1)
    assert state.dedup.get("acme", "alice", "old") is not None
    commit(state, direct_request("carol", "dave", "y"), NOW + TTL_MS)
    assert state.dedup.get("acme", "alice", "old") is None
    again = commit(state, direct_request("alice", "bob", "old"), NOW + TTL_MS)
    assert isinstance(again, Accepted)  # after the window a retry is a new message (7.2)
    assert again.record.conversation_seq == first.record.conversation_seq + 1


def test_7_2_dedup_key_is_tenant_sender_and_client_message_id() -> None:
    state = writer()
    assert isinstance(commit(state, direct_request("alice", "bob", "k")), Accepted)
    assert isinstance(commit(state, direct_request("bob", "alice", "k")), Accepted)
    assert isinstance(commit(state, direct_request("alice", "bob", "k", tenant="other")), Accepted)
    assert isinstance(commit(state, direct_request("alice", "bob", "k")), Duplicate)


def test_empty_client_message_id_is_never_deduplicated() -> None:
    state = writer()
    one = accepted(commit(state, direct_request("alice", "bob", "")))
    two = accepted(commit(state, direct_request("alice", "bob", "")))
    assert two.record.conversation_seq == one.record.conversation_seq + 1
    assert len(state.dedup) == 0


def test_first_entry_wins_and_the_cap_evicts_the_oldest() -> None:
    dedup = ClientDedup(ttl_seconds=7200, max_entries=2)
    dedup.record(("t", "u", "a"), _entry(NOW, 1))
    dedup.record(("t", "u", "a"), _entry(NOW, 9))
    assert dedup.get("t", "u", "a") == _entry(NOW, 1)
    dedup.record(("t", "u", "b"), _entry(NOW + 1))
    dedup.record(("t", "u", "c"), _entry(NOW + 2))
    assert dedup.get("t", "u", "a") is None and len(dedup) == 2
    assert dedup.evicted_early == 1
