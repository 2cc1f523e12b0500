"""PRESENCE_SUB core (spec 13.2, AT-52): limits without partial sets, snapshot, merged deltas."""

from __future__ import annotations

from qim.core.transient import OFFLINE, ONLINE, PresenceState, PresenceSubscription
from qim.core.transient.presence_view import PresenceView
from qim.schemas.records.presence import PresenceEntry, PresenceKey, encode_presence

ON, OFF = PresenceState(ONLINE, 1), PresenceState(OFFLINE, 2)


def test_over_the_limit_changes_nothing() -> None:
    sub = PresenceSubscription(max_targets=3)
    assert sub.update("subscribe", ["a", "b"]) is not None
    assert sub.update("subscribe", ["c", "d"]) is None  # 4 > 3: refused whole
    assert sub.targets == {"a", "b"}
    assert sub.update("replace", ["w", "x", "y", "z"]) is None
    assert sub.targets == {"a", "b"}


def test_subscribe_snapshots_every_target_replace_swaps_unsubscribe_removes() -> None:
    sub = PresenceSubscription(max_targets=10)
    first = sub.update("subscribe", ["b", "a"])
    assert first is not None and first.snapshot == ("a", "b") and first.added == ("a", "b")
    more = sub.update("subscribe", ["c"])
    assert more is not None and more.snapshot == ("a", "b", "c") and more.added == ("c",)
    swapped = sub.update("replace", ["c", "d"])
    assert swapped is not None and swapped.snapshot == ("c", "d")
    assert swapped.added == ("d",) and swapped.removed == ("a", "b")
    gone = sub.update("unsubscribe", ["c", "zz"])
    assert gone is not None and gone.removed == ("c",) and sub.targets == {"d"}


def test_the_first_change_leaves_at_once_later_ones_merge_over_the_window() -> None:
    sub = PresenceSubscription(max_targets=10, merge_window_ms=2000)
    sub.update("subscribe", ["a", "b"])
    sub.snapshot(["a", "b"], {})  # both offline
    assert sub.changed("a", 100) == 100
    assert sub.flush(100, {"a": ON}) == [("a", ON)]
    assert sub.changed("b", 500) == 2100  # inside the window: held until its end
    assert sub.changed("a", 600) == 2100
    assert sub.flush(600, {"a": OFF, "b": ON}) == []  # not due yet
    assert sub.flush(2100, {"a": OFF, "b": ON}) == [("a", OFF), ("b", ON)]


def test_a_change_back_before_the_flush_sends_nothing() -> None:
    sub = PresenceSubscription(max_targets=10, merge_window_ms=2000)
    sub.update("subscribe", ["a"])
    sub.snapshot(["a"], {"a": ON})
    assert sub.changed("a", 10) == 10
    assert sub.flush(10, {"a": ON}) == []  # a renewal: same state, nothing to tell
    assert sub.changed("zz", 10) is None  # not a target


def test_the_view_folds_every_partition_and_follows_leases_and_tombstones() -> None:
    view = PresenceView()
    entry = PresenceEntry(
        tenant_id="t", user_id="u", device_id="d", connection_id="c", node_id="n",
        connection_shard=1, session_epoch=1, lease_expire_at=10_000,
    )  # fmt: skip
    key = PresenceKey("t", "u", "d").encode()
    assert view.state("t", "u", 0).state == OFFLINE
    assert view.apply_record(7, key, encode_presence(entry), 5) == ("t", "u")
    assert view.state("t", "u", 6) == PresenceState(ONLINE, 5)
    assert view.online_devices("t", "u", 6) == ("d",)
    assert view.state("t", "u", 10_000).state == OFFLINE  # the lease ran out
    view.apply_record(7, key, None, 20)
    assert view.state("t", "u", 21) == PresenceState(OFFLINE, 20)
