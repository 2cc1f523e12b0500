"""Transition tables: the one mechanism behind the login barrier and flow control (style.md 6).

Why a table and not if/else: the whole behaviour of a machine is one literal you can read,
test cell by cell, and render for the docs (h11's ``_state.py`` is the model). Each cell maps
``(state, event)`` to a :class:`Transition`: the next state and the *action* the owner must
perform. A pair outside the table raises :class:`IllegalTransition` and the state stays as it
was -- such a pair is a bug of the caller (it fed an event the protocol never produces there),
never the peer's fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

__all__ = ["IllegalTransition", "Machine", "Transition", "TransitionTable"]

S = TypeVar("S", bound=Enum)
E = TypeVar("E", bound=Enum)
A = TypeVar("A", bound=Enum)


@dataclass(frozen=True, slots=True)
class Transition(Generic[S, A]):
    """One cell: where the machine goes and what its owner does on the way."""

    target: S
    action: A


class IllegalTransition(RuntimeError):
    """A (state, event) pair outside the table; the machine's state is left unchanged."""

    def __init__(self, table: str, state: Enum, event: Enum | str) -> None:
        name = event if isinstance(event, str) else event.name
        super().__init__(f"{table}: event {name} is illegal in state {state.name}")
        self.state = state
        self.event = event


class TransitionTable(Generic[S, E, A]):
    """An immutable table plus its renderings; ``step`` is the only way through it."""

    def __init__(
        self,
        name: str,
        initial: S,
        rows: Mapping[S, Mapping[E, Transition[S, A]]],
    ) -> None:
        self.name = name
        self.initial = initial
        self._rows = {state: dict(cells) for state, cells in rows.items()}

    def step(self, state: S, event: E) -> Transition[S, A]:
        """The cell for ``(state, event)``; raises IllegalTransition if there is none."""
        cell = self._rows.get(state, {}).get(event)
        if cell is None:
            raise IllegalTransition(self.name, state, event)
        return cell

    def is_legal(self, state: S, event: E) -> bool:
        return event in self._rows.get(state, {})

    def cells(self) -> list[tuple[S, E, Transition[S, A]]]:
        """Every legal cell, in declaration order (states, then events)."""
        return [(s, e, t) for s, row in self._rows.items() for e, t in row.items()]

    def render_mermaid(self) -> str:
        """A ``stateDiagram-v2`` of the table; cells sharing (from, to, action) share an edge.

        Edges are labelled ``EVENT, EVENT / action``; an action named NONE is left out.
        """
        edges: dict[tuple[str, str, str], list[str]] = {}
        for state, event, cell in self.cells():
            key = (state.name, cell.target.name, cell.action.name)
            edges.setdefault(key, []).append(event.name)
        lines = ["stateDiagram-v2", f"    [*] --> {self.initial.name}"]
        for (src, dst, action), events in edges.items():
            label = ", ".join(events)
            if action != "NONE":
                label += f" / {action}"
            lines.append(f"    {src} --> {dst}: {label}")
        return "\n".join(lines)

    def render_markdown(self, events: list[E]) -> str:
        """Rows: states, columns: ``events``; a cell is ``TARGET / ACTION``, blank = illegal."""
        lines = [
            "| state | " + " | ".join(e.name for e in events) + " |",
            "|---|" + "---|" * len(events),
        ]
        for state, row in self._rows.items():
            cells = [
                f"{row[e].target.name} / {row[e].action.name}" if e in row else "" for e in events
            ]
            lines.append(f"| {state.name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


class Machine(Generic[S, E, A]):
    """One instance's state, moved only through its table."""

    __slots__ = ("state", "table")

    def __init__(self, table: TransitionTable[S, E, A], state: S | None = None) -> None:
        self.table = table
        self.state: S = table.initial if state is None else state

    def fire(self, event: E) -> A:
        """Apply ``event`` and return the cell's action; raises IllegalTransition (unchanged)."""
        cell = self.table.step(self.state, event)
        self.state = cell.target
        return cell.action
