"""Property: through barrier + flow, no event is lost without MAILBOX_DIRTY (9.4.2, 11.3.1).

Random programs of pushes (covered and new, out of order, of random sizes), SYNC_COMPLETE,
socket consumption, node-budget purges, idle timeouts and PINGs drive one ConnectionPush
with small watermarks. A model tracks every event above ``sync_to_seq``: it is written, still
queued, or dropped -- and every drop must be reported (ERROR{MAILBOX_DIRTY} or a PONG with
``mailbox_dirty``) or still pending in the flag, unless the connection is closing (the next
session's sync covers it, 11.3.1). Also: nothing <= sync_to_seq is ever written, the login
queue is released in mailbox_seq order, and last_pushed_user_seq never decreases (I-21).
"""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.push import (
    CloseConnection,
    ConnectionPush,
    FlowLimits,
    FlowState,
    PushAction,
    SignalDirty,
    WritePush,
)
from qim.params.values import Watermark

from .support import flow_state, pending

SYNC_TO = 100
LIMITS = FlowLimits(Watermark(bytes=4_000, items=20), Watermark(bytes=12_000, items=60), 1_000, 5)

ops = st.one_of(
    st.tuples(st.just("push"), st.integers(1, 300), st.integers(70, 1_500)),
    st.tuples(st.just("sync_complete"), st.just(0), st.just(0)),
    st.tuples(st.just("drain"), st.integers(0, 10), st.just(0)),
    st.tuples(st.just("purge"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("ping"), st.just(0), st.just(0)),
    st.tuples(st.just("idle"), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=80), st.integers(3, 30))
def test_9_4_2_and_11_3_1_no_event_is_lost_without_mailbox_dirty(
    program: list[tuple[str, int, int]], queue_items: int
) -> None:
    push = ConnectionPush(SYNC_TO, limits=LIMITS, queue_limit=Watermark(4_000, queue_items))
    in_buffer: deque[WritePush] = deque()  # written, not yet consumed by the socket
    written: list[int] = []
    unreported: set[int] = set()
    next_new = SYNC_TO + 1
    last_pushed = SYNC_TO

    for op, a, b in program:
        if flow_state(push) is FlowState.CLOSING:
            break
        queued_before = {p.mailbox_seq for p in push.barrier.queued}
        offered: set[int] = set()
        actions: list[PushAction]
        if op == "push":
            if a <= SYNC_TO:
                seq = a  # covered by the client's pull
            else:
                seq, next_new = next_new + a % 3, next_new + a % 3 + 1
                offered.add(seq)
            actions = push.offer(pending(seq, ledger_bytes=b))
        elif op == "sync_complete":
            if push.barrier.state.name != "SYNCING":
                continue
            actions = push.sync_complete()
            released = [w.mailbox_seq for w in actions if isinstance(w, WritePush)]
            assert released == sorted(released)  # 9.4.1 ascending mailbox_seq
        elif op == "drain":
            frames = [in_buffer.popleft() for _ in range(min(a, len(in_buffer)))]
            actions = push.drained(sum(f.ledger_bytes for f in frames), len(frames))
        elif op == "purge":
            frames = [in_buffer.pop() for _ in range(min(a, len(in_buffer)))]
            unreported.update(f.mailbox_seq for f in frames)  # purged = lost unless reported
            actions = push.over_budget(sum(f.ledger_bytes for f in frames), len(frames))
        elif op == "ping":
            pushed, dirty = push.pong()
            assert pushed >= last_pushed
            last_pushed = pushed
            if dirty:
                unreported.clear()
            actions = []
        else:
            actions = push.idle_timeout()

        now_written = [w.mailbox_seq for w in actions if isinstance(w, WritePush)]
        in_buffer.extend(w for w in actions if isinstance(w, WritePush))
        assert all(seq > SYNC_TO for seq in now_written)  # 9.4.1: never pushed, pulled
        written += now_written
        queued_after = {p.mailbox_seq for p in push.barrier.queued}
        vanished = (queued_before | offered) - queued_after - set(now_written)
        closing = any(isinstance(x, CloseConnection) for x in actions)
        if not closing:
            unreported |= vanished
        if any(isinstance(x, SignalDirty) for x in actions):
            unreported.clear()
        if unreported and flow_state(push) is not FlowState.CLOSING:
            assert push.mailbox_dirty, f"silently lost {sorted(unreported)}"
            assert push.audit() == []
