"""REACT on the writer core against an independent model (spec 13.6.2-13.6.4, 7.15).

The system under test is the pure path the ConversationWriter runs: ``handle_react`` decides on
the MessageStore, an accepted record is folded (``apply``) and archived (``archive_batch``) into
an in-memory store; recalls are archived as ``MessageAmended``. The model is a set of
``(reaction_key, user)`` rows per message plus the adds that went uncounted past the detail cap,
and a version counter: nothing of the store layout or the record. After every step the replies,
the aggregate a history page joins and the PULL_REACTIONS pages must equal the model's; at the
end the log replayed into a fresh store and a fresh writer state must give the same bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from qim.core.conversation import ConversationWriterState, Duplicate, Reacted, Rejected
from qim.core.history import MemoryOrderedStore, archive_batch, decode_message_record, message_key
from qim.core.reactions.decide import ReactTarget
from qim.core.reactions.store import joined_reactions, reaction_page
from qim.schemas.frames.errors import ErrorCode
from qim.schemas.records import ReactRequest
from qim.schemas.records.outbox import MessageReacted, OutboxRecord
from tests.unit.conversation.support import REGION, WRITER, config
from tests.unit.history.support import C, T, committed
from tests.unit.history.test_archiver_amend import amended

USERS = ("u1", "u2", "u3", "u4")
KEYS = ("like", "heart")
SEQS = (1, 2)
CAP = 3  # reaction_detail_max_per_message, small so the walk crosses it
NOW = 1_700_000_100_000
TARGET = ReactTarget(kind="group", participants=(), member_count=len(USERS), membership_version=1)


@dataclass
class _Message:
    rows: set[tuple[str, str]] = field(default_factory=set)
    uncounted: Counter[str] = field(default_factory=Counter)
    version: int = 0
    complete: bool = True
    recalled: bool = False

    def counts(self) -> dict[str, int]:
        out = Counter(k for k, _ in self.rows)
        out.update(self.uncounted)
        return {k: n for k, n in sorted(out.items()) if n > 0}

    def mine(self, user: str) -> tuple[str, ...]:
        return tuple(sorted(k for k, u in self.rows if u == user))


class _Model:
    def __init__(self) -> None:
        self.messages = {seq: _Message() for seq in SEQS}
        self.changes = 0

    def react(self, seq: int, user: str, key: str, add: bool) -> str:
        """``"changed"``, ``"noop"`` or ``"refused"``."""
        m = self.messages[seq]
        if m.recalled:
            return "refused"
        has = (key, user) in m.rows
        if add:
            if has:
                return "noop"
            if len(m.rows) < CAP:
                m.rows.add((key, user))
            else:
                m.uncounted[key] += 1
                m.complete = False
        else:
            if not has:
                return "noop"
            m.rows.discard((key, user))
        m.version += 1
        self.changes += 1
        return "changed"

    def recall(self, seq: int) -> None:
        self.messages[seq] = _Message(recalled=True)


class _System:
    def __init__(self) -> None:
        self.cfg = config(reaction_detail_max_per_message=CAP)
        self.state = ConversationWriterState(self.cfg, region_id=REGION, writer_id=WRITER)
        self.store = MemoryOrderedStore()
        self.log: list[OutboxRecord] = []
        self.now = NOW
        self.rid = 0
        for seq in SEQS:
            self._commit(committed(seq))

    def _commit(self, record: OutboxRecord) -> None:
        self.log.append(record)
        self.state.apply(record)
        for w in archive_batch([record], read=self.store.get, keys_under=self._keys_under):
            if w.value is None:
                self.store.delete(w.key)
            else:
                self.store.put(w.key, w.value)

    def _keys_under(self, prefix: bytes) -> list[bytes]:
        return [k for k, _ in self.store.scan(prefix, prefix, False)]

    def react(self, seq: int, user: str, key: str, add: bool) -> Reacted | Duplicate | Rejected:
        self.now += 1_000  # one per second: never near per_user_reaction_rate
        self.rid += 1
        request = ReactRequest(
            tenant_id=T,
            user_id=user,
            device_id="d1",
            session_epoch=1,
            connection_shard=0,
            request_id=self.rid,
            conversation_id=C,
            conversation_seq=seq,
            reaction_key=key,
            action="add" if add else "remove",
        )
        raw = self.store.get(message_key(T, C, seq))
        original = None if raw is None else decode_message_record(raw)
        decision = self.state.handle_react(
            request, self.now, TARGET, original, self.store, visible=(0, None)
        )
        if isinstance(decision, Reacted):
            self._commit(decision.record)
        return decision

    def recall(self, seq: int) -> None:
        self._commit(amended(100 + len(self.log), seq, "recall"))


_REACT = st.tuples(
    st.just("react"),
    st.sampled_from(SEQS),
    st.sampled_from(USERS),
    st.sampled_from(KEYS),
    st.sampled_from((True, True, False)),  # add / remove: enough adds to reach the cap
)
_RECALL = st.tuples(
    st.just("recall"), st.sampled_from(SEQS), st.just(""), st.just(""), st.just(True)
)
_OPS = st.lists(st.one_of(*[_REACT] * 12, _RECALL), max_size=60)  # a recall ends a message


def _check_reads(system: _System, model: _Model) -> None:
    for viewer in USERS:
        joined = joined_reactions(system.store, T, C, min(SEQS), max(SEQS), viewer)
        for seq, m in model.messages.items():
            counts = m.counts()
            if not counts:
                assert seq not in joined
                continue
            assert joined[seq].counts == counts
            assert joined[seq].summary_version == m.version
            assert joined[seq].self_reaction_keys == m.mine(viewer)
    for seq, m in model.messages.items():
        for key in (*KEYS, ""):
            page = reaction_page(
                system.store, T, C, seq, key, offset=0, limit=100, detail_served=True
            )
            counts = m.counts()
            assert page.total == (counts.get(key, 0) if key else sum(counts.values()))
            rows = sorted(r for r in m.rows if not key or r[0] == key)
            want = [u for _, u in rows] if m.complete else []
            assert list(page.users) == want and not page.has_more
            hidden = reaction_page(
                system.store, T, C, seq, key, offset=0, limit=100, detail_served=False
            )
            assert hidden.users == () and hidden.total == page.total  # 13.6.3 item 3


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS)
def test_13_6_react_matches_the_model_and_the_log_replays_to_the_same_state(
    ops: list[tuple[str, int, str, str, bool | int]],
) -> None:
    system, model = _System(), _Model()
    for op, seq, user, key, add in ops:
        if op == "recall":
            system.recall(seq)
            model.recall(seq)
            _check_reads(system, model)
            continue
        decision = system.react(seq, user, key, bool(add))
        expected = model.react(seq, user, key, bool(add))
        m = model.messages[seq]
        if expected == "refused":
            assert isinstance(decision, Rejected)
            assert decision.code == ErrorCode.PERMISSION_DENIED
            assert decision.reply.error is not None and decision.reply.error.request_id
            continue
        assert isinstance(decision, Reacted if expected == "changed" else Duplicate)
        update = decision.reply.reaction_update
        assert update is not None  # a no-op still answers with the current aggregate
        assert update.counts == m.counts() and update.summary_version == m.version
        assert update.self_reaction_keys == m.mine(user)
        _check_reads(system, model)
    # replay: the same log into a fresh store (one batch) and a fresh writer state
    fresh = MemoryOrderedStore()
    writes = archive_batch(system.log, read=fresh.get, keys_under=lambda p: [])
    for w in writes:
        if w.value is None:
            fresh.delete(w.key)
        else:
            fresh.put(w.key, w.value)
    assert list(fresh.scan(b"", b"", False)) == list(system.store.scan(b"", b"", False))
    replayed = ConversationWriterState(system.cfg, region_id=REGION, writer_id=WRITER)
    for record in system.log:
        replayed.apply(record)
    assert replayed.snapshot() == system.state.snapshot()
    # a repeated add or a remove of nothing appends no record (13.6.2)
    assert sum(isinstance(r, MessageReacted) for r in system.log) == model.changes
