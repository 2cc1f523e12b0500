"""The client state table (style item 6): legal paths, illegal ones raise and change nothing."""

from __future__ import annotations

import pytest

from qim.client import (
    TRANSITIONS,
    ClientEvent,
    ClientState,
    ClientStateMachine,
    IllegalTransition,
    TooManyRedirects,
)
from qim.client.state import mermaid

E, S = ClientEvent, ClientState


def test_login_path_reaches_authenticated() -> None:
    fsm = ClientStateMachine()
    for event in (E.DIAL, E.OPENED, E.AUTH_OK):
        fsm.fire(event)
    assert fsm.state is S.AUTHENTICATED
    assert fsm.redirects == 0


def test_one_redirect_is_followed_5_3_2() -> None:
    fsm = ClientStateMachine()
    for event in (E.DIAL, E.OPENED, E.REDIRECT, E.DIAL, E.OPENED, E.AUTH_OK):
        fsm.fire(event)
    assert (fsm.state, fsm.redirects) == (S.AUTHENTICATED, 1)


def test_second_redirect_raises_and_leaves_state_5_3_2() -> None:
    fsm = ClientStateMachine()
    for event in (E.DIAL, E.OPENED, E.REDIRECT, E.DIAL, E.OPENED):
        fsm.fire(event)
    with pytest.raises(TooManyRedirects):
        fsm.fire(E.REDIRECT)
    assert (fsm.state, fsm.redirects) == (S.CONNECTED, 1)


@pytest.mark.parametrize("state", list(ClientState))
@pytest.mark.parametrize("event", list(ClientEvent))
def test_every_pair_outside_the_table_is_illegal(state: ClientState, event: ClientEvent) -> None:
    fsm = ClientStateMachine()
    fsm.state = state
    if (state, event) in TRANSITIONS:
        assert fsm.fire(event) is TRANSITIONS[state, event]
    else:
        with pytest.raises(IllegalTransition):
            fsm.fire(event)
        assert fsm.state is state


def test_closed_is_terminal_and_reachable_from_every_other_state() -> None:
    assert not any(source is S.CLOSED for source, _ in TRANSITIONS)
    assert {s for s in S if (s, E.CLOSE) in TRANSITIONS} == set(S) - {S.CLOSED}


def test_mermaid_lists_every_transition() -> None:
    text = mermaid()
    assert text.count("-->") == len(TRANSITIONS) + 2
