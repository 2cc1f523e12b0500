"""The connection state table (style.md item 6): every legal and every illegal transition."""

from __future__ import annotations

import itertools

import pytest

from qim.gateway.states import (
    TRANSITIONS,
    ConnState,
    ConnStateMachine,
    Event,
    IllegalTransition,
    render_table,
)

S, E = ConnState, Event

# The expected table, written out independently of the module's own.
EXPECTED: dict[tuple[ConnState, Event], ConnState] = {
    (S.AWAITING_AUTH, E.AUTH): S.AUTHENTICATING,
    **{(S.AWAITING_AUTH, e): S.CLOSED for e in (
        E.PING, E.FRAME, E.UNKNOWN, E.LIMIT_EXCEEDED, E.PROTOCOL_ERROR, E.PEER_CLOSED,
        E.TIMEOUT, E.SHUTDOWN)},
    (S.AUTHENTICATING, E.PING): S.AUTHENTICATING,
    (S.AUTHENTICATING, E.AUTH_ACCEPTED): S.ONLINE,
    **{(S.AUTHENTICATING, e): S.CLOSED for e in (
        E.AUTH, E.FRAME, E.UNKNOWN, E.LIMIT_EXCEEDED, E.PROTOCOL_ERROR, E.PEER_CLOSED,
        E.AUTH_REJECTED, E.REFUSE, E.KICK, E.TIMEOUT, E.SHUTDOWN)},
    (S.ONLINE, E.AUTH): S.RENEWING,
    **{(S.ONLINE, e): S.ONLINE for e in (E.PING, E.FRAME, E.UNKNOWN, E.LIMIT_EXCEEDED)},
    **{(S.ONLINE, e): S.CLOSED for e in (
        E.BAD_REAUTH, E.PROTOCOL_ERROR, E.PEER_CLOSED, E.REFUSE, E.KICK, E.TIMEOUT,
        E.SHUTDOWN)},
    (S.RENEWING, E.AUTH_ACCEPTED): S.ONLINE,
    **{(S.RENEWING, e): S.RENEWING for e in (E.PING, E.FRAME, E.UNKNOWN, E.LIMIT_EXCEEDED)},
    **{(S.RENEWING, e): S.CLOSED for e in (
        E.AUTH, E.BAD_REAUTH, E.PROTOCOL_ERROR, E.PEER_CLOSED, E.AUTH_REJECTED, E.REFUSE,
        E.KICK, E.TIMEOUT, E.SHUTDOWN)},
    **{(S.CLOSED, e): S.CLOSED for e in Event},
}  # fmt: skip

ALL_PAIRS = list(itertools.product(ConnState, Event))


def test_table_is_exactly_the_expected_one() -> None:
    actual = {(s, e): t for s, row in TRANSITIONS.items() for e, t in row.items()}
    assert actual == EXPECTED


@pytest.mark.parametrize(("state", "event"), [p for p in ALL_PAIRS if p in EXPECTED])
def test_legal_transition_moves_to_the_table_state(state: ConnState, event: Event) -> None:
    machine = ConnStateMachine(state)
    assert machine.fire(event) is state
    assert machine.state is EXPECTED[(state, event)]


@pytest.mark.parametrize(("state", "event"), [p for p in ALL_PAIRS if p not in EXPECTED])
def test_illegal_transition_raises_and_leaves_the_state(state: ConnState, event: Event) -> None:
    machine = ConnStateMachine(state)
    with pytest.raises(IllegalTransition) as info:
        machine.fire(event)
    assert machine.state is state
    assert (info.value.state, info.value.event) == (state, event)


def test_illegal_pairs_are_only_node_decisions() -> None:
    """Whatever a peer sends is legal in every state: only the node can misuse the table."""
    peer_events = {E.AUTH, E.PING, E.FRAME, E.UNKNOWN, E.LIMIT_EXCEEDED, E.PROTOCOL_ERROR,
                   E.PEER_CLOSED, E.TIMEOUT, E.SHUTDOWN}  # fmt: skip
    for state in ConnState:
        assert peer_events <= set(TRANSITIONS[state]), state


def test_closed_is_absorbing_and_only_online_states_reach_online() -> None:
    assert all(t is S.CLOSED for t in TRANSITIONS[S.CLOSED].values())
    into_online = {s for s, row in TRANSITIONS.items() for t in row.values() if t is S.ONLINE}
    assert into_online == {S.AUTHENTICATING, S.ONLINE, S.RENEWING}


def test_rendered_table_lists_every_state() -> None:
    text = render_table()
    for state in ConnState:
        assert f"| {state.value} |" in text
