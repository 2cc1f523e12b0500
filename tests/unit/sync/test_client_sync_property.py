"""The SDK against the server's pure functions over random logs (spec 9.3, 9.4.3; I-21, I-24)."""

from __future__ import annotations

from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.client.sync import DeviceCursor, MailboxSync
from qim.core.sync import AuthSync, PullLimits, sign_cursor
from qim.schemas.frames import MailboxBatch, OnlineReady, PullMailbox, PushEvents, SyncEntry

from .support import IDENTITY, NOW, RING, Mailbox, ServerSession, entry

TOKEN = sign_cursor(IDENTITY.claims(NOW), RING)


def key(e: SyncEntry) -> tuple[bytes, int]:
    return (e.message_id, e.event_id)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 300),  # W
    st.data(),
    st.integers(1, 4),  # window
    st.integers(1, 5),  # max_items
    st.randoms(use_true_random=False),
)
def test_i21_i24_login_converges_and_pushes_never_move_the_cursor(
    w: int, data: st.DataObject, window: int, max_items: int, rnd: Random
) -> None:
    trim = data.draw(st.integers(0, w))
    box = Mailbox(lane_watermark=w, trim_watermark=trim)
    for seq in data.draw(st.sets(st.integers(trim + 1, w + 50), max_size=30)):
        box.add(seq, data.draw(st.integers(1, 4)))
    start = data.draw(st.one_of(st.just(0), st.integers(max(trim, 1), max(w, 1))))
    start = min(start, w)
    sync = MailboxSync(
        DeviceCursor(TOKEN if start else b"", start), window=window, max_items=max_items
    )
    server = ServerSession(box)
    ok = server.authenticate(sync.auth_cursor())
    assert isinstance(ok, AuthSync)
    queue = sync.on_auth_ok(ok.auth_ok())
    delivered: list[SyncEntry] = []
    pushed: list[SyncEntry] = []
    limits = PullLimits(max_items=max_items)
    for _ in range(200):
        if not queue:
            break
        if rnd.random() < 0.3:  # a push arrives during the barrier (9.4.3 step 3)
            late = entry(w + 100 + len(pushed))
            before = sync.cursor
            assert (
                sync.on_push(PushEvents(events=(late,), last_pushed_user_seq=late.mailbox_seq), NOW)
                == []
            )
            assert sync.cursor == before
            pushed.append(late)
        request: PullMailbox = queue.pop(rnd.randrange(len(queue)))
        batch = server.pull(request, limits)
        assert isinstance(batch, MailboxBatch)
        delivered += sync.on_batch(request, batch, NOW)
        queue += [r for r in sync.next_requests() if r not in queue]
    assert not queue
    complete = sync.sync_complete()
    assert complete is not None
    assert isinstance(server.complete(complete), OnlineReady)
    delivered += sync.on_online_ready(NOW)
    assert sync.cursor.last_applied_mailbox_seq == w
    expected = box.entries_in(ok.start_seq if start else 0, w) + pushed
    assert sorted(map(key, delivered)) == sorted(map(key, expected))
