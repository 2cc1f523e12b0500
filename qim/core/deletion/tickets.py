"""Deletion tickets of spec 21.3.3 and legal holds of 21.5.3 as a pure fold.

A deletion is never one call: it is a ticket that goes through intake, the hold check, the
cool-down (``user_deletion_grace`` / ``tenant_deletion_grace``), a four-eyes review, the key
destruction, an audit record and the 21.4 sweep. Every step is an event; :class:`Desk` folds
events in log order and returns the effects the shell must carry out (keys to destroy, audit
records to append, sweep steps to run). Nothing here reads a clock: each event carries its
``at`` (ms), and the cool-down ends on a :class:`Tick` whose ``at`` has passed it.

Rules, each from the spec:

* A hold (tenant, conversation, user, optionally a time range) beats every deletion: a ticket
  whose subject it covers is **deferred** with an audit record naming the hold and its basis
  ("deferred due to legal hold obligation"), never accepted and quietly kept; lifting the last
  covering hold re-queues it (21.5.3 points 1-3).
* During the cool-down the subject is logically invisible but recoverable: :meth:`Desk.hidden`
  says so, and a :class:`TicketCancelled` restores it (21.3.3 step 3).
* Four-eyes (step 4): a reviewer other than the requester confirms; a tenant's TMK needs two
  distinct reviewers besides the requester.
* A user deletion destroys the user's UserDEK, never a ConversationDEK (21.3.2 trade-off 1); a
  conversation (or a dissolved group) its ConversationDEK and every EphemeralDEK under it; a
  tenant its TenantMasterKey.
* The audit record holds identifiers and actions only (21.5.2): ``{ticket_id, actor[],
  subject_id, dek_ids[], ts, basis}``; ``key_destroy_lag`` = destroyed at - cool-down end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgspec

from qim.core.keys.ids import KeyScope

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


class SubjectKind(enum.StrEnum):
    USER = "user"
    CONVERSATION = "conversation"
    TENANT = "tenant"


class TicketState(enum.StrEnum):
    COOLING = "cooling"
    DEFERRED_HOLD = "deferred_hold"
    DESTROYED = "destroyed"
    CANCELLED = "cancelled"


class TicketOpened(msgspec.Struct, frozen=True, kw_only=True, tag="opened"):
    ticket_id: str
    tenant_id: str
    kind: SubjectKind
    subject_id: str
    basis: str
    requester: str
    at: int


class TicketConfirmed(msgspec.Struct, frozen=True, kw_only=True, tag="confirmed"):
    ticket_id: str
    actor: str
    at: int


class TicketCancelled(msgspec.Struct, frozen=True, kw_only=True, tag="cancelled"):
    ticket_id: str
    actor: str
    at: int


class HoldPlaced(msgspec.Struct, frozen=True, kw_only=True, tag="hold_placed"):
    """A ``compliance_hold``: on the whole tenant (``kind`` TENANT), one conversation or one
    user; ``from_at`` / ``until_at`` bound the messages it keeps (0 = open)."""

    hold_id: str
    tenant_id: str
    kind: SubjectKind
    subject_id: str
    basis: str
    actor: str
    at: int
    from_at: int = 0
    until_at: int = 0


class HoldLifted(msgspec.Struct, frozen=True, kw_only=True, tag="hold_lifted"):
    hold_id: str
    actor: str
    at: int


class Tick(msgspec.Struct, frozen=True, kw_only=True, tag="tick"):
    at: int


Event = TicketOpened | TicketConfirmed | TicketCancelled | HoldPlaced | HoldLifted | Tick


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One append-only audit line (21.3.3 step 6, 21.5.2): identifiers and actions, no body."""

    action: str
    ticket_id: str
    tenant_id: str
    subject_id: str
    actors: tuple[str, ...]
    basis: str
    ts: int
    dek_ids: tuple[tuple[int, str], ...] = ()
    hold_id: str = ""
    key_destroy_lag_ms: int = -1


class DestroyKeys(msgspec.Struct, frozen=True, kw_only=True):
    """Hard-destroy every version of these ``(key_scope, key_id)`` keys of the tenant (and,
    for a conversation, every EphemeralDEK bucket under it)."""

    ticket_id: str
    tenant_id: str
    keys: tuple[tuple[int, str], ...]


class SweepStep(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the 21.4 cascade checklist to run for a destroyed ticket's subject."""

    ticket_id: str
    tenant_id: str
    kind: SubjectKind
    subject_id: str
    row: int
    location: str
    method: str


Effect = AuditRecord | DestroyKeys | SweepStep

# 21.4: (row, location, method) by subject kind. Rows that hold no data for the kind (9) or
# whose store is not built here (10 media, 12 archive, 13 backups, 14 search) are left out;
# the README's deletion section names them.
_CHECKLIST: dict[SubjectKind, tuple[tuple[int, str, str], ...]] = {
    SubjectKind.USER: (
        (4, "UserMailboxEntry", "physical range delete of the user's mailbox rows"),
        (5, "UserConversationState", "physical delete of the user's rows"),
        (6, "UserSessionProjection", "physical delete of the user's rows"),
        (7, "UserBadgeState", "physical delete"),
        (15, "logs", "expire after observability_log_retention_days"),
        (16, "device tokens and push payload cache", "delete and unbind device_token"),
        (17, "PresenceEntry", "tombstone on the compacted presence topic"),
        (18, "MessageReaction", "delete the user's reactions, decrement the summaries"),
        (20, "MemberSlotMap", "leave every group, slot released, never reused"),
    ),
    SubjectKind.CONVERSATION: (
        (1, "MessageRecord", "crypto-erased with the ConversationDEK"),
        (2, "MessageIndex", "physical delete"),
        (4, "UserMailboxEntry", "physical delete of every member's entries of it"),
        (8, "ConversationHead.preview_or_placeholder", "rewrite to the generic placeholder"),
        (11, "MailboxNode checkpoints", "crypto-erased; old checkpoints age out"),
        (18, "MessageReaction", "physical delete"),
        (19, "MessageReactionSummary", "physical delete"),
    ),
    SubjectKind.TENANT: (
        (1, "MessageRecord", "crypto-erased with the TenantMasterKey"),
        (2, "MessageIndex", "physical delete"),
        (4, "UserMailboxEntry", "physical delete"),
        (5, "UserConversationState", "physical delete"),
        (6, "UserSessionProjection", "physical delete"),
        (7, "UserBadgeState", "physical delete"),
        (8, "ConversationHead.preview_or_placeholder", "crypto-erased with the TMK"),
        (11, "MailboxNode checkpoints", "crypto-erased; old checkpoints age out"),
        (16, "device tokens and push payload cache", "delete and unbind device_token"),
        (17, "PresenceEntry", "tombstones"),
        (18, "MessageReaction", "physical delete"),
        (19, "MessageReactionSummary", "physical delete"),
        (20, "MemberSlotMap", "physical delete"),
    ),
}

_KEY_SCOPE = {
    SubjectKind.USER: KeyScope.USER,
    SubjectKind.CONVERSATION: KeyScope.CONVERSATION,
    SubjectKind.TENANT: KeyScope.TENANT,
}


def sweep_plan(
    ticket_id: str, tenant_id: str, kind: SubjectKind, subject_id: str
) -> list[SweepStep]:
    """The 21.4 rows a destroyed subject of ``kind`` needs, in row order."""
    return [
        SweepStep(
            ticket_id=ticket_id,
            tenant_id=tenant_id,
            kind=kind,
            subject_id=subject_id,
            row=row,
            location=location,
            method=method,
        )
        for row, location, method in _CHECKLIST[kind]
    ]


@dataclass
class TicketView:
    """A ticket as the desk holds it (what the admin API shows)."""

    opened: TicketOpened
    state: TicketState
    cool_down_ends_at: int
    reviewers: list[str] = field(default_factory=list)
    hold_ids: list[str] = field(default_factory=list)
    destroyed_at: int = 0

    @property
    def reviewers_needed(self) -> int:
        return 2 if self.opened.kind is SubjectKind.TENANT else 1


@dataclass
class Desk:
    """Every ticket and hold of the log, folded; :meth:`apply` returns the effects of one event.

    ``grace_ms`` is the cool-down per subject kind (``user_deletion_grace`` for users and
    conversations, ``tenant_deletion_grace`` for tenants).
    """

    grace_ms: dict[SubjectKind, int]
    tickets: dict[str, TicketView] = field(default_factory=dict)
    holds: dict[str, HoldPlaced] = field(default_factory=dict)

    def apply(self, event: Event) -> list[Effect]:
        if isinstance(event, TicketOpened):
            return self._open(event)
        if isinstance(event, TicketConfirmed):
            return self._confirm(event)
        if isinstance(event, TicketCancelled):
            return self._cancel(event)
        if isinstance(event, HoldPlaced):
            return self._place(event)
        if isinstance(event, HoldLifted):
            return self._lift(event)
        return self._tick(event.at)

    def hidden(self, tenant_id: str, kind: SubjectKind, subject_id: str) -> bool:
        """Whether the subject is logically invisible: a ticket for it cools down or is done."""
        return any(
            t.opened.tenant_id == tenant_id
            and t.opened.kind is kind
            and t.opened.subject_id == subject_id
            and t.state in (TicketState.COOLING, TicketState.DESTROYED)
            for t in self.tickets.values()
        )

    def covering_holds(self, opened: TicketOpened) -> list[str]:
        """The live holds a deletion of ``opened``'s subject would break, sorted by id."""
        return sorted(h.hold_id for h in self.holds.values() if _covers(h, opened))

    # -- events -----------------------------------------------------------------------------

    def _open(self, e: TicketOpened) -> list[Effect]:
        if e.ticket_id in self.tickets:
            return []  # the log may repeat an intake; the first one counts
        view = TicketView(
            opened=e, state=TicketState.COOLING, cool_down_ends_at=e.at + self.grace_ms[e.kind]
        )
        self.tickets[e.ticket_id] = view
        out: list[Effect] = [_audit("ticket_opened", view, (e.requester,), e.at)]
        holds = self.covering_holds(e)
        if holds:
            view.state = TicketState.DEFERRED_HOLD
            view.hold_ids = holds
            out += [
                _audit("deferred_due_to_legal_hold", view, (e.requester,), e.at, hold_id=h)
                for h in holds
            ]
        return out

    def _confirm(self, e: TicketConfirmed) -> list[Effect]:
        view = self.tickets.get(e.ticket_id)
        if view is None or view.state not in (TicketState.COOLING, TicketState.DEFERRED_HOLD):
            return []
        if e.actor == view.opened.requester or e.actor in view.reviewers:
            return []  # four eyes: the requester cannot review their own ticket, nor twice
        view.reviewers.append(e.actor)
        return [_audit("ticket_confirmed", view, (e.actor,), e.at)]

    def _cancel(self, e: TicketCancelled) -> list[Effect]:
        view = self.tickets.get(e.ticket_id)
        if view is None or view.state not in (TicketState.COOLING, TicketState.DEFERRED_HOLD):
            return []  # a destroyed key cannot come back
        view.state = TicketState.CANCELLED
        return [_audit("ticket_cancelled", view, (e.actor,), e.at)]

    def _place(self, e: HoldPlaced) -> list[Effect]:
        if e.hold_id in self.holds:
            return []
        self.holds[e.hold_id] = e
        out: list[Effect] = []
        for view in self._ordered():
            if view.state is TicketState.COOLING and _covers(e, view.opened):
                view.state = TicketState.DEFERRED_HOLD
                view.hold_ids = self.covering_holds(view.opened)
                out.append(
                    _audit("deferred_due_to_legal_hold", view, (e.actor,), e.at, hold_id=e.hold_id)
                )
            elif view.state is TicketState.DEFERRED_HOLD and _covers(e, view.opened):
                view.hold_ids = self.covering_holds(view.opened)
        return out

    def _lift(self, e: HoldLifted) -> list[Effect]:
        out: list[Effect] = []
        if self.holds.pop(e.hold_id, None) is None:
            return self._tick(e.at)  # a repeated lift changes no hold, but time has passed
        for view in self._ordered():
            if view.state is not TicketState.DEFERRED_HOLD or e.hold_id not in view.hold_ids:
                continue
            view.hold_ids = self.covering_holds(view.opened)
            if not view.hold_ids:
                view.state = TicketState.COOLING  # re-queued; its cool-down is not restarted
                out.append(_audit("requeued_after_hold", view, (e.actor,), e.at, hold_id=e.hold_id))
        return out + self._tick(e.at)

    def _tick(self, now: int) -> list[Effect]:
        out: list[Effect] = []
        for view in self._ordered():
            if (
                view.state is not TicketState.COOLING
                or now < view.cool_down_ends_at
                or len(view.reviewers) < view.reviewers_needed
            ):
                continue
            o = view.opened
            keys = ((int(_KEY_SCOPE[o.kind]), o.subject_id),)
            view.state = TicketState.DESTROYED
            view.destroyed_at = now
            out.append(DestroyKeys(ticket_id=o.ticket_id, tenant_id=o.tenant_id, keys=keys))
            out.append(
                _audit(
                    "keys_destroyed",
                    view,
                    (o.requester, *view.reviewers),
                    now,
                    dek_ids=keys,
                    lag=now - view.cool_down_ends_at,
                )
            )
            out.extend(sweep_plan(o.ticket_id, o.tenant_id, o.kind, o.subject_id))
        return out

    def _ordered(self) -> list[TicketView]:
        return [self.tickets[t] for t in sorted(self.tickets)]


def _covers(hold: HoldPlaced, opened: TicketOpened) -> bool:
    """A tenant hold covers everything of its tenant; a conversation or user hold covers a
    deletion of that subject and of the whole tenant (a tenant deletion would erase it)."""
    if hold.tenant_id != opened.tenant_id:
        return False
    if hold.kind is SubjectKind.TENANT or opened.kind is SubjectKind.TENANT:
        return True
    return hold.kind is opened.kind and hold.subject_id == opened.subject_id


def _audit(
    action: str,
    view: TicketView,
    actors: tuple[str, ...],
    at: int,
    *,
    hold_id: str = "",
    dek_ids: tuple[tuple[int, str], ...] = (),
    lag: int = -1,
) -> AuditRecord:
    o = view.opened
    return AuditRecord(
        action=action,
        ticket_id=o.ticket_id,
        tenant_id=o.tenant_id,
        subject_id=o.subject_id,
        actors=actors,
        basis=o.basis,
        ts=at,
        dek_ids=dek_ids,
        hold_id=hold_id,
        key_destroy_lag_ms=lag,
    )
