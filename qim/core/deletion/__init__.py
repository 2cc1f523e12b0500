"""Deletion that holds (spec 21.3.3, 21.4, 21.5.3): tickets, legal holds, the cascade list."""

from qim.core.deletion.tickets import (
    AuditRecord,
    Desk,
    DestroyKeys,
    Effect,
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
    TicketView,
    sweep_plan,
)

__all__ = [
    "AuditRecord",
    "Desk",
    "DestroyKeys",
    "Effect",
    "Event",
    "HoldLifted",
    "HoldPlaced",
    "SubjectKind",
    "SweepStep",
    "Tick",
    "TicketCancelled",
    "TicketConfirmed",
    "TicketOpened",
    "TicketState",
    "TicketView",
    "sweep_plan",
]
