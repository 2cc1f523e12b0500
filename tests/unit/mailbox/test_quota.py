"""``max_conversations_per_user`` on the MailboxNode's side (qim.core.mailbox.quota, I-26).

The crossing rule alone, then the whole path on a real fold: a record appears exactly when a
committed fold moves the user's listed count across the cap, up (a new conversation) or down
(a local delete), and never for a message in a conversation already listed.
"""

from __future__ import annotations

import pytest

from qim.core.mailbox import MemoryMailboxStore, commit, materialize
from qim.core.mailbox.quota import listed_count, plan_quota_records, quota_crossing
from qim.core.mailbox.result import MaterializeResult
from qim.schemas.records.user_quota import UserQuota, decode_user_quota, encode_user_quota
from qim.schemas.records.user_state import UserStateCommand
from tests.unit.mailbox.support import (
    BASE_TIME,
    CONFIG,
    EPOCH,
    SHARD,
    T,
    dispatch,
    local_users,
    run,
)

ME, PEER_A, PEER_B, PEER_C, PEER_D = local_users(5, "q")
CAP = 3


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (2, 3, True),  # up: the cap-th conversation is the last one let in
        (3, 2, False),  # down: a delete frees a slot
        (1, 2, None),  # below the cap both times
        (3, 4, None),  # repeated: already exhausted (a late joiner past the cap)
        (4, 3, None),  # still at the cap after a delete
        (3, 3, None),
        (0, 5, True),
        (5, 0, False),
    ],
)
def test_crossing(before: int, after: int, expected: bool | None) -> None:
    assert quota_crossing(before, after, CAP) is expected


def test_record_round_trips_and_is_keyed_and_partitioned_by_user() -> None:
    record = UserQuota(
        tenant_id=T,
        user_id=ME,
        conversations=5000,
        exhausted=True,
        as_of_mailbox_seq=(1 << 40) + 7,
        mailbox_shard=SHARD,
    )
    assert decode_user_quota(encode_user_quota(record)) == record
    assert (record.partition, record.key) == (SHARD, f"{T}\x00{ME}".encode())


class _Chat:
    """Dispatches to ME's shard, numbered in log order."""

    def __init__(self, store: MemoryMailboxStore) -> None:
        self.store, self.offset, self.seqs = store, 0, dict[str, int]()

    def message(self, peer: str) -> list[UserQuota]:
        conv = f"d-{peer}"
        self.seqs[conv] = self.seqs.get(conv, 0) + 1
        self.offset += 1
        d = dispatch(
            self.offset,
            conversation=conv,
            sender=peer,
            participants=(ME, peer),
            seq_in_conversation=self.seqs[conv],
            payload=b"hi",
        )
        return self._plan(run(self.store, [(self.offset, d)]))

    def delete(self, peer: str) -> list[UserQuota]:
        self.offset += 1
        command = UserStateCommand(
            tenant_id=T,
            user_id=ME,
            conversation_id=f"d-{peer}",
            action="delete",
            command_id=(9000 + self.offset).to_bytes(16, "big"),
            target_mailbox_shard=SHARD,
            committed_at=BASE_TIME + self.offset,
            origin_device_id="phone",
        )
        result = materialize(self.store, [(self.offset, command)], shard_epoch=EPOCH, config=CONFIG)
        commit(self.store, result)
        return self._plan(result)

    def _plan(self, result: MaterializeResult) -> list[UserQuota]:
        mine = [c for c in result.sessions if c.user_id == ME]
        return plan_quota_records(
            self.store, mine, limit=CAP, mailbox_shard=SHARD, as_of_mailbox_seq=self.offset
        )


def _state(records: list[UserQuota]) -> list[tuple[int, bool]]:
    return [(r.conversations, r.exhausted) for r in records]


def test_a_fold_publishes_only_when_the_listed_count_crosses_the_cap() -> None:
    chat = _Chat(MemoryMailboxStore())
    assert chat.message(PEER_A) == []
    assert chat.message(PEER_B) == []
    assert chat.message(PEER_B) == []  # an existing conversation: the count does not move
    assert _state(chat.message(PEER_C)) == [(3, True)]  # the third: at the cap
    assert chat.message(PEER_A) == []  # still 3
    assert chat.message(PEER_D) == []  # 4: past the cap, no new crossing (in flight)
    assert listed_count(chat.store, T, ME) == 4
    assert chat.delete(PEER_D) == []  # 3: still at the cap
    assert _state(chat.delete(PEER_C)) == [(2, False)]  # a slot is free again
    assert chat.delete(PEER_C) == []  # deleting again changes nothing
    assert _state(chat.message(PEER_C)) == [(3, True)]  # a new message resurrects it


def test_each_user_counts_their_own_rows() -> None:
    """The senders live on the same shard: each has one conversation (with ME), ME has three."""
    chat = _Chat(MemoryMailboxStore())
    for peer in (PEER_A, PEER_B, PEER_C):
        chat.message(peer)
    assert listed_count(chat.store, T, ME) == 3
    assert [listed_count(chat.store, T, p) for p in (PEER_A, PEER_B, PEER_D)] == [1, 1, 0]
