"""Device rules of one user on its ConnectionShard (§5.4.4, §15.2.2, B.5 max_devices_per_user)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qim.gateway.devices import DeviceRegistry, Kick


def reg(limit: int = 8) -> DeviceRegistry[str]:
    return DeviceRegistry(limit)


def test_different_devices_coexist() -> None:
    r = reg()
    assert r.admit("t", "u", "phone", 1, "c1", 0).kicks == ()
    assert r.admit("t", "u", "desk", 1, "c2", 1).kicks == ()
    assert set(r.devices("t", "u")) == {"phone", "desk"}


def test_same_device_with_a_larger_epoch_replaces_the_old_connection() -> None:
    r = reg()
    r.admit("t", "u", "phone", 4, "old", 0)
    admission = r.admit("t", "u", "phone", 5, "new", 1)
    assert admission.admitted
    assert admission.kicks == (Kick("old", "phone", "replaced", "phone"),)
    slot = r.current("t", "u", "phone")
    assert slot is not None and (slot.conn, slot.session_epoch) == ("new", 5)


def test_a_stale_or_equal_epoch_loses_to_the_live_one() -> None:
    """§15.2.2: the larger session_epoch is the sole authority, never first-come-wins."""
    r = reg()
    r.admit("t", "u", "phone", 5, "live", 0)
    for epoch in (4, 5):
        admission = r.admit("t", "u", "phone", epoch, f"late{epoch}", 1)
        assert not admission.admitted
        assert admission.kicks == (Kick(f"late{epoch}", "phone", "replaced", "phone"),)
    slot = r.current("t", "u", "phone")
    assert slot is not None and slot.conn == "live"


def test_the_ninth_device_kicks_the_least_recently_active() -> None:
    r = reg()
    for i in range(8):
        r.admit("t", "u", f"d{i}", 1, f"c{i}", 100 + i)
    r.touch("t", "u", "d0", "c0", 500)  # d0 was oldest; now d1 is
    admission = r.admit("t", "u", "d8", 1, "c8", 600)
    assert admission.admitted
    assert admission.kicks == (Kick("c1", "d1", "replaced", "d8"),)
    assert len(r.devices("t", "u")) == 8 and "d1" not in r.devices("t", "u")


def test_release_of_a_replaced_connection_keeps_its_successor() -> None:
    r = reg()
    r.admit("t", "u", "phone", 1, "old", 0)
    r.admit("t", "u", "phone", 2, "new", 1)
    assert r.release("t", "u", "phone", "old") is False  # no tombstone for the successor's key
    assert r.release("t", "u", "phone", "new") is True
    assert len(r) == 0 and r.devices("t", "u") == {}


def test_users_are_independent() -> None:
    r = reg(limit=1)
    r.admit("t", "a", "d", 1, "ca", 0)
    assert r.admit("t", "b", "d", 1, "cb", 0).kicks == ()
    assert r.admit("t2", "a", "d", 1, "cc", 0).kicks == ()


@given(st.lists(st.tuples(st.integers(0, 11), st.integers(1, 6)), max_size=60))
def test_invariants_hold_for_any_login_sequence(logins: list[tuple[int, int]]) -> None:
    """At most max devices live; each device's live epoch only grows."""
    r = reg(limit=4)
    best: dict[str, int] = {}
    for step, (device_no, epoch) in enumerate(logins):
        device = f"d{device_no}"
        live = r.current("t", "u", device)
        admission = r.admit("t", "u", device, epoch, f"c{step}", step)
        if live is not None and epoch <= live.session_epoch:
            assert not admission.admitted
        assert len(r.devices("t", "u")) <= 4
        slot = r.current("t", "u", device)
        if slot is not None:
            assert slot.session_epoch >= best.get(device, 0) or live is None
            best[device] = slot.session_epoch
