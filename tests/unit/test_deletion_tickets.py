"""Deletion tickets and legal holds (spec 21.3.3, 21.4, 21.5.3): examples and a model check.

The model check draws random event logs and compares the desk's key destructions with an
independent reference that decides each ticket by scanning the log directly: a ticket's keys
are destroyed at the first tick (or hold lift) at which it was not cancelled, its cool-down has
ended, enough distinct reviewers other than the requester had confirmed, and no live hold
covered its subject.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qim.core.deletion import (
    AuditRecord,
    Desk,
    DestroyKeys,
    Event,
    HoldLifted,
    HoldPlaced,
    SubjectKind,
    SweepStep,
    Tick,
    TicketCancelled,
    TicketConfirmed,
    TicketOpened,
    TicketState,
)
from qim.core.keys.ids import KeyScope

GRACE = {SubjectKind.USER: 100, SubjectKind.CONVERSATION: 100, SubjectKind.TENANT: 300}


def _desk() -> Desk:
    return Desk(grace_ms=dict(GRACE))


def _open(tid: str, kind: SubjectKind, subject: str, at: int, tenant: str = "t1") -> TicketOpened:
    return TicketOpened(
        ticket_id=tid, tenant_id=tenant, kind=kind, subject_id=subject, basis="gdpr-17",
        requester="alice", at=at,
    )  # fmt: skip


def _run(desk: Desk, events: list[Event]) -> list[object]:
    out: list[object] = []
    for e in events:
        out += desk.apply(e)
    return out


def test_a_user_ticket_destroys_the_userdek_only_after_cool_down_and_a_second_pair_of_eyes() -> (
    None
):
    desk = _desk()
    effects = _run(desk, [_open("k1", SubjectKind.USER, "bob", 0)])
    assert desk.hidden("t1", SubjectKind.USER, "bob")  # invisible at once, recoverable
    assert [e.action for e in effects if isinstance(e, AuditRecord)] == ["ticket_opened"]
    assert _run(desk, [TicketConfirmed(ticket_id="k1", actor="alice", at=5)]) == []  # own ticket
    assert not any(isinstance(e, DestroyKeys) for e in _run(desk, [Tick(at=150)]))  # no reviewer
    _run(desk, [TicketConfirmed(ticket_id="k1", actor="carol", at=160)])
    assert not any(isinstance(e, DestroyKeys) for e in _run(desk, [Tick(at=99)]))
    effects = _run(desk, [Tick(at=170)])
    destroy = [e for e in effects if isinstance(e, DestroyKeys)]
    assert destroy == [DestroyKeys(ticket_id="k1", tenant_id="t1", keys=((KeyScope.USER, "bob"),))]
    audit = [e for e in effects if isinstance(e, AuditRecord)]
    assert audit[0].action == "keys_destroyed"
    assert audit[0].actors == ("alice", "carol") and audit[0].key_destroy_lag_ms == 70
    assert audit[0].dek_ids == ((KeyScope.USER, "bob"),) and audit[0].basis == "gdpr-17"
    rows = [e.row for e in effects if isinstance(e, SweepStep)]
    assert {4, 5, 6, 7, 16, 17, 20} <= set(rows) and 1 not in rows  # no ConversationDEK
    assert _run(desk, [Tick(at=500)]) == []  # destroyed once
    assert desk.tickets["k1"].state is TicketState.DESTROYED


def test_a_held_user_is_deferred_with_the_hold_named_and_requeued_when_it_is_lifted() -> None:
    desk = _desk()
    hold = HoldPlaced(
        hold_id="h1", tenant_id="t1", kind=SubjectKind.USER, subject_id="bob",
        basis="litigation 42", actor="legal", at=0,
    )  # fmt: skip
    effects = _run(desk, [hold, _open("k1", SubjectKind.USER, "bob", 10)])
    deferred = [e for e in effects if isinstance(e, AuditRecord) and e.hold_id]
    assert [(e.action, e.hold_id) for e in deferred] == [("deferred_due_to_legal_hold", "h1")]
    assert not desk.hidden("t1", SubjectKind.USER, "bob")  # refused: the data stays visible
    _run(desk, [TicketConfirmed(ticket_id="k1", actor="carol", at=20)])
    assert not any(isinstance(e, DestroyKeys) for e in _run(desk, [Tick(at=1_000)]))
    effects = _run(desk, [HoldLifted(hold_id="h1", actor="legal", at=2_000)])
    actions = [e.action for e in effects if isinstance(e, AuditRecord)]
    assert actions[0] == "requeued_after_hold" and "keys_destroyed" in actions
    assert any(isinstance(e, DestroyKeys) for e in effects)


def test_a_tenant_hold_covers_every_subject_and_a_tenant_ticket_is_covered_by_any_hold() -> None:
    desk = _desk()
    _run(desk, [
        HoldPlaced(hold_id="h1", tenant_id="t1", kind=SubjectKind.CONVERSATION, subject_id="g:1",
                   basis="b", actor="legal", at=0),
        _open("k-tenant", SubjectKind.TENANT, "t1", 1),
        _open("k-other-tenant", SubjectKind.USER, "bob", 1, tenant="t2"),
    ])  # fmt: skip
    assert desk.tickets["k-tenant"].state is TicketState.DEFERRED_HOLD
    assert desk.tickets["k-other-tenant"].state is TicketState.COOLING


def test_a_tenant_master_key_needs_two_distinct_reviewers_besides_the_requester() -> None:
    desk = _desk()
    _run(desk, [
        _open("k1", SubjectKind.TENANT, "t1", 0),
        TicketConfirmed(ticket_id="k1", actor="carol", at=1),
        TicketConfirmed(ticket_id="k1", actor="carol", at=2),
    ])  # fmt: skip
    assert not any(isinstance(e, DestroyKeys) for e in _run(desk, [Tick(at=400)]))
    _run(desk, [TicketConfirmed(ticket_id="k1", actor="dave", at=401)])
    destroy = [e for e in _run(desk, [Tick(at=402)]) if isinstance(e, DestroyKeys)]
    assert destroy[0].keys == ((KeyScope.TENANT, "t1"),)


def test_a_cancel_in_the_cool_down_restores_the_subject_and_a_destroyed_key_stays_destroyed() -> (
    None
):
    desk = _desk()
    _run(desk, [_open("k1", SubjectKind.CONVERSATION, "g:1", 0),
                TicketCancelled(ticket_id="k1", actor="alice", at=50)])  # fmt: skip
    assert not desk.hidden("t1", SubjectKind.CONVERSATION, "g:1")
    assert _run(desk, [TicketConfirmed(ticket_id="k1", actor="carol", at=60), Tick(at=500)]) == []
    _run(desk, [_open("k2", SubjectKind.CONVERSATION, "g:1", 600),
                TicketConfirmed(ticket_id="k2", actor="carol", at=601), Tick(at=700)])  # fmt: skip
    assert _run(desk, [TicketCancelled(ticket_id="k2", actor="alice", at=701)]) == []
    assert desk.tickets["k2"].state is TicketState.DESTROYED


# -- model check ----------------------------------------------------------------------------

KINDS = [SubjectKind.USER, SubjectKind.CONVERSATION, SubjectKind.TENANT]
SUBJECTS = {SubjectKind.USER: ["bob", "eve"], SubjectKind.CONVERSATION: ["g:1"],
            SubjectKind.TENANT: ["t1"]}  # fmt: skip
ACTORS = ["alice", "carol", "dave"]
MODEL_GRACE = {SubjectKind.USER: 40, SubjectKind.CONVERSATION: 40, SubjectKind.TENANT: 90}


@st.composite
def event_logs(draw: st.DrawFn) -> list[Event]:
    events: list[Event] = []
    at = 0
    n_tickets = 0
    holds: list[str] = []
    for _ in range(draw(st.integers(1, 60))):
        at += draw(st.integers(0, 30))
        choice = draw(st.sampled_from(["open", "confirm", "cancel", "hold", "lift", "tick"]))
        if choice == "open" or n_tickets == 0:
            kind = draw(st.sampled_from(KINDS))
            n_tickets += 1
            events.append(TicketOpened(
                ticket_id=f"k{n_tickets}", tenant_id="t1", kind=kind,
                subject_id=draw(st.sampled_from(SUBJECTS[kind])), basis="b",
                requester=draw(st.sampled_from(ACTORS)), at=at,
            ))  # fmt: skip
        elif choice == "confirm":
            events.append(TicketConfirmed(ticket_id=f"k{draw(st.integers(1, n_tickets))}",
                                          actor=draw(st.sampled_from(ACTORS)), at=at))  # fmt: skip
        elif choice == "cancel":
            events.append(TicketCancelled(ticket_id=f"k{draw(st.integers(1, n_tickets))}",
                                          actor="alice", at=at))  # fmt: skip
        elif choice == "hold":
            kind = draw(st.sampled_from(KINDS))
            holds.append(f"h{len(holds) + 1}")
            events.append(HoldPlaced(
                hold_id=holds[-1], tenant_id="t1", kind=kind,
                subject_id=draw(st.sampled_from(SUBJECTS[kind])), basis="b", actor="legal", at=at,
            ))  # fmt: skip
        elif choice == "lift" and holds:
            events.append(HoldLifted(hold_id=draw(st.sampled_from(holds)), actor="legal", at=at))
        else:
            events.append(Tick(at=at))
    return events


def _reference(events: list[Event]) -> dict[str, int]:
    """ticket -> the time its keys are destroyed, decided per ticket by scanning the log."""
    out: dict[str, int] = {}
    opened = {e.ticket_id: e for e in events if isinstance(e, TicketOpened)}
    for tid, o in opened.items():
        start = events.index(o)
        if any(isinstance(e, TicketOpened) and e.ticket_id == tid for e in events[:start]):
            continue
        reviewers: set[str] = set()
        live_holds: dict[str, HoldPlaced] = {
            e.hold_id: e for e in events[:start] if isinstance(e, HoldPlaced)
        }
        for e in events[:start]:
            if isinstance(e, HoldLifted):
                live_holds.pop(e.hold_id, None)
        needed = 2 if o.kind is SubjectKind.TENANT else 1
        for e in events[start + 1 :]:
            if isinstance(e, TicketCancelled) and e.ticket_id == tid:
                break
            if isinstance(e, TicketConfirmed) and e.ticket_id == tid and e.actor != o.requester:
                reviewers.add(e.actor)
            if isinstance(e, HoldPlaced):
                live_holds.setdefault(e.hold_id, e)
            if isinstance(e, HoldLifted):
                live_holds.pop(e.hold_id, None)
            held = any(
                h.kind is SubjectKind.TENANT or o.kind is SubjectKind.TENANT
                or (h.kind is o.kind and h.subject_id == o.subject_id)
                for h in live_holds.values()
            )  # fmt: skip
            if (
                isinstance(e, Tick | HoldLifted)
                and not held
                and len(reviewers) >= needed
                and e.at >= o.at + MODEL_GRACE[o.kind]
            ):
                out[tid] = e.at
                break
    return out


@settings(max_examples=200, deadline=None)
@given(event_logs())
def test_the_desk_destroys_exactly_what_the_reference_model_says(events: list[Event]) -> None:
    desk = Desk(grace_ms=dict(MODEL_GRACE))
    destroyed: dict[str, int] = {}
    for e in events:
        for effect in desk.apply(e):
            if isinstance(effect, DestroyKeys):
                assert effect.ticket_id not in destroyed, "a key destroyed twice"
                destroyed[effect.ticket_id] = e.at
            if isinstance(effect, AuditRecord):
                assert effect.ticket_id in desk.tickets
    assert destroyed == _reference(events)
    for tid, at in destroyed.items():
        view = desk.tickets[tid]
        assert view.state is TicketState.DESTROYED and view.destroyed_at == at
        assert view.opened.requester not in view.reviewers
