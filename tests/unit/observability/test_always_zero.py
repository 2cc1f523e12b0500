"""Every always-zero counter moves when its violation is injected (issue 25, spec 24.1.5).

A counter that is 0 because nothing can increment it proves nothing, so each one the
audit test and ``qim chaos`` require to be 0 (``qim/observability/always_zero.py``) is
driven here through the code path that detects its violation, on the registry of the process
that exports it: the fold's counters through ``materialize`` and ``MailboxMetrics.on_batch``
(mailbox), ``qim_fanout_stalled_total`` through the coordinator's ``feed_live``
(conversation). ``cursor_advanced_by_push_total`` (gateway) is driven in
``tests/unit/gateway/test_login_sync_node.py``. ``mailbox_cursor_rebase_count`` has no
detecting path yet: no reply carries CURSOR_REBASED (``qim/observability/names.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
from prometheus_client import CollectorRegistry

from qim.agents.fanout.metrics import FanoutMetrics
from qim.agents.fanout.partition import PartitionFanout
from qim.agents.fanout.round import feed_live
from qim.agents.mailbox.metrics import MailboxMetrics
from qim.core.fanout import FanoutConfig, FanoutState
from qim.core.mailbox import MemoryMailboxStore, keys
from qim.core.mailbox.result import MaterializeResult
from qim.core.mailbox.values import decode_vector, encode_vector
from qim.schemas.frames import ErrorCode
from qim.schemas.records import encode_outbox_record
from tests.unit.fanout.support import Outbox
from tests.unit.mailbox.support import (
    CONFIG,
    Log,
    dispatch,
    group_slice,
    local_users,
    run,
    seq,
)

G = "g:zero"


def _mailbox() -> tuple[CollectorRegistry, MailboxMetrics]:
    registry = CollectorRegistry()
    return registry, MailboxMetrics(registry, dict)


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sample's value; a missing series fails (it is never read as 0)."""
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


def _on_batch(metrics: MailboxMetrics, result: MaterializeResult, regressed: bool) -> None:
    metrics.on_batch(CONFIG.mailbox_shard, result, 0.001, regressed)


def test_a_lane_held_below_its_published_watermark_counts_a_regression_and_keeps_w() -> None:
    """Injected: a store whose W[] was published past a dispatch still waiting for its
    slice (what a bug upstream of ``advance_watermarks`` would leave). The fold keeps W,
    counts ``lane_watermark_regression_total``, and the node's metrics raise
    ``mailbox_seq_regression_count``."""
    members = [(u, 0) for u in local_users(4)]
    waiting = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=2)
    store = MemoryMailboxStore()
    run(store, [(0, waiting)])  # pending: no slice yet, W stays below seq(0)
    published = tuple(seq(5) for _ in range(CONFIG.lane_count))
    store.apply([(keys.WATERMARKS, encode_vector(published))])

    result = run(store, [(6, dispatch(2, sender=members[0][0], participants=(members[1][0],)))])
    assert result.metrics["lane_watermark_regression_total"] >= 1
    kept = decode_vector(store.get(keys.WATERMARKS), CONFIG.lane_count)
    assert all(w >= p for w, p in zip(kept, published, strict=True))  # never moved back

    registry, metrics = _mailbox()
    assert _sample(registry, "mailbox_seq_regression_count") == 0
    _on_batch(metrics, result, regressed=False)
    assert _sample(registry, "mailbox_seq_regression_count") == 1
    label = str(CONFIG.mailbox_shard)
    assert _sample(registry, "lane_watermark_regression_total", shard=label) >= 1


def test_an_applied_seq_that_went_backwards_counts_a_mailbox_seq_regression() -> None:
    """Injected: the node saw the shard's applied seq move back across a batch (the node's
    ``regressed`` flag; the fold itself cannot lower it, it skips seq <= applied)."""
    store = MemoryMailboxStore()
    a, b = local_users(2)
    clean = run(store, [(0, dispatch(1, sender=b, participants=(a, b)))])
    registry, metrics = _mailbox()
    _on_batch(metrics, clean, regressed=False)
    assert _sample(registry, "mailbox_seq_regression_count") == 0
    _on_batch(metrics, clean, regressed=True)
    assert _sample(registry, "mailbox_seq_regression_count") == 1


def test_a_cursor_rebased_login_reply_counts_mailbox_cursor_rebase() -> None:
    """The counting path only: no MailboxNode reply carries CURSOR_REBASED yet."""
    registry, metrics = _mailbox()
    assert _sample(registry, "mailbox_cursor_rebase_count_total") == 0
    metrics.on_reply("sync_auth", int(ErrorCode.CURSOR_REBASED))
    assert _sample(registry, "mailbox_cursor_rebase_count_total") == 1
    assert _sample(registry, "login_total") == 1


def test_a_member_slice_for_another_shard_counts_misrouted_and_is_not_stored() -> None:
    members = [(u, 0) for u in local_users(3)]
    (chunk,) = group_slice(G, 2, members, shard=CONFIG.mailbox_shard + 1)
    store = MemoryMailboxStore()
    result = run(store, [(0, chunk)])
    assert result.metrics["dispatch_misrouted_total"] == 1
    assert result.metrics["member_slice_chunks_total"] == 0

    registry, metrics = _mailbox()
    _on_batch(metrics, result, regressed=False)
    label = str(CONFIG.mailbox_shard)
    assert _sample(registry, "dispatch_misrouted_total", shard=label) == 1


def test_chunks_that_cannot_form_a_slice_count_member_slice_invalid_and_fail_closed() -> None:
    """Injected: the second chunk of a version names fewer users than its slot bitmap. The
    dispatch pinned to that version stays pending (no recipient is skipped or guessed)."""
    members = [(u, 0) for u in local_users(6)]
    first, second = group_slice(G, 2, members, chunk=3)
    broken = msgspec.structs.replace(second, user_ids=second.user_ids[:-1])
    d = dispatch(1, conversation=G, kind="group", sender=members[0][0], version=2)
    store = MemoryMailboxStore()
    result = run(store, [(0, first), (1, d), (2, broken)])
    assert result.metrics["member_slice_invalid_total"] == 1
    assert [p.mailbox_seq for p in result.pending] == [seq(1)]
    assert result.written == ()

    registry, metrics = _mailbox()
    _on_batch(metrics, result, regressed=False)
    label = str(CONFIG.mailbox_shard)
    assert _sample(registry, "member_slice_invalid_total", shard=label) == 1


def test_a_stale_fencing_epoch_is_exported_as_stale_epoch_dispatch_dropped() -> None:
    a, b = local_users(2)
    store = MemoryMailboxStore()
    log: Log = [
        (0, dispatch(1, sender=b, participants=(a, b), fencing_epoch=3)),
        (1, dispatch(2, sender=b, participants=(a, b), fencing_epoch=2)),  # a fenced writer
    ]
    result = run(store, log)
    registry, metrics = _mailbox()
    _on_batch(metrics, result, regressed=False)
    label = str(CONFIG.mailbox_shard)
    assert _sample(registry, "stale_epoch_dispatch_dropped_total", shard=label) == 1


def test_an_undecodable_outbox_record_counts_qim_fanout_stalled() -> None:
    """Injected: garbage at offset 2 of a live partition: the coordinator's feed stops there,
    pauses the partition and counts the stall."""
    outbox = Outbox()
    outbox.create("g:a", "owner", ["m1", "m2"])
    outbox.send("g:a", "owner")
    values = [encode_outbox_record(r) for r in outbox.log] + [b"\xc1 not msgpack"]
    records = [SimpleNamespace(offset=i, value=v) for i, v in enumerate(values)]
    registry = CollectorRegistry()
    metrics = FanoutMetrics(registry)
    part = PartitionFanout(0, FanoutState(FanoutConfig()), 0)
    assert _sample(registry, "qim_fanout_stalled_total") == 0
    fed, pause = feed_live(part, records, metrics, max_held=100)
    assert pause and fed.stalled is not None and fed.stalled.offset == len(outbox.log)
    assert _sample(registry, "qim_fanout_stalled_total") == 1
