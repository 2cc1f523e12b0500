"""The MailboxNode's side of offline push (16.1.1, PD-1): which devices get a PushTask.

Pure: the shell calls :func:`plan_push_tasks` only after the fold's WriteBatch is durable (the
16.1.1 precondition "materialize first, then push"), with the entries read back from the
committed store, the user's UserBadgeState as written by the same fold, the digest cache and
the presence cache. Per device, never per user (16.2.2): D(user) = the devices the
``device_token_digest`` cache lists (a device without a token cannot be woken and gets
nothing); a device with an unexpired PresenceEntry is online and gets the socket; every other
device of D(user) gets a PushTask, whatever the user's other devices do (PD-1: phone offline
and desktop online -> the phone is pushed, the desktop is not).

* a new entry that counts unread (MESSAGE / MENTION with COUNTS_UNREAD) -> an ``alert`` task
  carrying that entry's ids and the badge numbers;
* a badge change without such an entry (a read on another device, a badge reaching 0, 16.3)
  -> a silent ``badge`` task, event id ``badge:<badge_projection_mailbox_seq>`` so a replay of
  the same version is deduplicated by the NotificationService.

Mute and ``notification_policy`` (16.4) apply here, at the push layer only: each alert entry
passes :func:`notifies` under its conversation's :func:`push_policy` (``ALL`` -> every
unread-counting event; ``MENTION_ONLY`` -> only ``AT_ME`` / ``AT_ALL`` / ``REPLY_ME``;
``MUTED``, what ``muted`` lowers it to -> only ``AT_ME`` / ``REPLY_ME``: 11.4.3's push-storm
rule, a muted conversation gets no notification for an @all unless the tenant sets
``at_all_notify_muted``, which makes ``muted`` the plain 16.4 ``MENTION_ONLY``; ``NONE`` ->
nothing, not even @me). Unread, ``total_mention``, the
list and the badge are untouched (the fold wrote them already). A suppressed entry is treated
like an entry that makes no alert: when the fold changed the badge and no other alert of the
fold carries it, the device gets the silent ``badge`` task (decision: a muted message still
moves ``muted_unread`` / ``total_unread`` per ``include_muted_in_badge``, and 16.3 wants every
badge change on the offline device; it never sounds or shows a banner).

E2EE (16.7, 22.4 item 1): an alert for a message of an end-to-end encrypted conversation (the
fold's ``e2ee`` conversations, from the shard's message facts, never from the body) is flagged
``e2ee`` and carries :data:`E2EE_PUSH_PLACEHOLDER` as its text: no body, thumbnail or file
name; the badge numbers are the same as for any alert.

The second check for online devices (16.1.2): :func:`plan_device_tasks` also returns the alert
tasks an online wakeable device would get, which the MailboxNode holds in
:class:`~qim.core.notify.second_check.SecondCheck` until PUSHED / APPLIED evidence, the
``push_grace_window`` / ``push_confirm_extended_window`` or the device's CONN_CLOSED decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from qim.schemas.frames.base import EntryFlags, EventType, MentionType
from qim.schemas.frames.mailbox import SyncEntry
from qim.schemas.records.notify import DeviceKey, DeviceTokenDigest, PushTask

__all__ = [
    "E2EE_PUSH_PLACEHOLDER",
    "MUTED",
    "Badge",
    "DigestCache",
    "UserFold",
    "notifies",
    "plan_device_tasks",
    "plan_push_tasks",
    "push_policy",
]

E2EE_PUSH_PLACEHOLDER: Final = "You received a new message"
"""22.4 item 1: the default push text of an E2EE conversation (a tenant text is not built)."""

_MENTIONS = {
    MentionType.NONE: "NONE",
    MentionType.AT_ME: "AT_ME",
    MentionType.AT_ALL: "AT_ALL",
    MentionType.REPLY_ME: "REPLY_ME",
}

_BREAK_THROUGH: Final = frozenset({"AT_ME", "AT_ALL", "REPLY_ME"})
"""16.4: the ``mention_type`` values a ``MENTION_ONLY`` conversation still alerts for."""

_MUTED_BREAK_THROUGH: Final = frozenset({"AT_ME", "REPLY_ME"})
"""11.4.3: a muted conversation alerts for targeted mentions only, not for @all."""

MUTED: Final = "MUTED"
"""The policy of a muted conversation (not a ``notification_policy`` value of its own)."""


def push_policy(muted: bool, notification_policy: str, *, at_all_notify_muted: bool = False) -> str:
    """16.4 / 11.4.3: the policy push applies to one conversation. ``NONE`` stays ``NONE``;
    ``muted`` lowers the rest to :data:`MUTED` (muting alone never silences @me, and silences
    @all unless the tenant's ``at_all_notify_muted``, then ``MENTION_ONLY``). Anything else
    than the three values reads as ``ALL``: a wrong value must cost an extra wake-up, never a
    silence."""
    if notification_policy == "NONE":
        return "NONE"
    if muted:
        return "MENTION_ONLY" if at_all_notify_muted else MUTED
    if notification_policy == "MENTION_ONLY":
        return "MENTION_ONLY"
    return "ALL"


def notifies(policy: str, mention_type: str) -> bool:
    """16.4: whether an unread-counting event of ``mention_type`` alerts under ``policy``."""
    if policy == "NONE":
        return False
    if policy == "MENTION_ONLY":
        return mention_type in _BREAK_THROUGH
    if policy == MUTED:
        return mention_type in _MUTED_BREAK_THROUGH
    return True


@dataclass
class DigestCache:
    """The MailboxNode's local copy of ``device_token_digest``: devices with a token per user."""

    users: dict[tuple[str, str], dict[str, DeviceTokenDigest]] = field(default_factory=dict)
    count: int = 0

    def apply(self, key: DeviceKey, digest: DeviceTokenDigest | None) -> None:
        """One record: a digest registers / overwrites, ``None`` (tombstone) removes."""
        user = (key.tenant_id, key.user_id)
        if digest is None:
            devices = self.users.get(user)
            if devices is not None and devices.pop(key.device_id, None) is not None:
                self.count -= 1
                if not devices:
                    del self.users[user]
            return
        devices = self.users.setdefault(user, {})
        self.count += key.device_id not in devices
        devices[key.device_id] = digest

    def devices(self, tenant_id: str, user_id: str) -> tuple[str, ...]:
        """D(user)'s wakeable devices (a registered, valid token), sorted."""
        found = self.users.get((tenant_id, user_id), {})
        return tuple(sorted(d for d, g in found.items() if g.bundle_env_valid))

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True, slots=True)
class Badge:
    """The user's UserBadgeState after the fold (the same numbers BADGE_UPDATE carries)."""

    total_unread: int
    total_mention: int
    muted_unread: int
    badge_projection_mailbox_seq: int


@dataclass(frozen=True, slots=True)
class UserFold:
    """What one committed fold did for one user: new entries, the badge, whether it changed.

    ``policies`` are ``(conversation_id, push_policy)`` of the entries' conversations whose
    policy is not ``ALL`` (:func:`push_policy` of the user's UserConversationState).
    ``e2ee`` are the entries' conversations that are end-to-end encrypted (16.7)."""

    tenant_id: str
    user_id: str
    entries: tuple[SyncEntry, ...]
    badge: Badge
    badge_changed: bool
    policies: tuple[tuple[str, str], ...] = ()
    e2ee: tuple[str, ...] = ()


def _alerting(entry: SyncEntry, policies: Mapping[str, str]) -> bool:
    counts = entry.event_type in (EventType.MESSAGE, EventType.MENTION) and bool(
        entry.flags & EntryFlags.COUNTS_UNREAD
    )
    policy = policies.get(entry.conversation_id, "ALL")
    return counts and notifies(policy, _MENTIONS.get(entry.mention_type, "NONE"))


def plan_push_tasks(
    folds: Iterable[UserFold],
    *,
    digests: DigestCache,
    online: Mapping[tuple[str, str], Sequence[str]],
    conversation_types: Mapping[str, str] | None = None,
) -> list[PushTask]:
    """The PushTasks of one committed fold, per offline wakeable device (module doc).

    ``online`` maps (tenant, user) to the device ids with an unexpired PresenceEntry.
    """
    return plan_device_tasks(
        folds, digests=digests, online=online, conversation_types=conversation_types
    )[0]


def plan_device_tasks(
    folds: Iterable[UserFold],
    *,
    digests: DigestCache,
    online: Mapping[tuple[str, str], Sequence[str]],
    conversation_types: Mapping[str, str] | None = None,
) -> tuple[list[PushTask], list[PushTask]]:
    """``(for offline devices, for the second check)``: the first go out now; the second are
    the alert tasks the online wakeable devices would get if they were offline, held by
    :class:`~qim.core.notify.second_check.SecondCheck` until evidence or the window (16.1.2).
    An online device gets no held badge task: BADGE_UPDATE reaches its socket, and a zombie's
    badge rides the alert that catches it up (the shell refreshes the numbers at emission)."""
    tasks: list[PushTask] = []
    held: list[PushTask] = []
    kinds = conversation_types or {}
    for fold in folds:
        wakeable = digests.devices(fold.tenant_id, fold.user_id)
        if not wakeable:
            continue
        on = set(online.get((fold.tenant_id, fold.user_id), ()))
        policies = dict(fold.policies)
        encrypted = frozenset(fold.e2ee)
        alerts = sorted(
            (e for e in fold.entries if _alerting(e, policies)), key=lambda e: e.mailbox_seq
        )
        b = fold.badge
        for device in wakeable:
            out = held if device in on else tasks
            for entry in alerts:
                out.append(
                    PushTask(
                        tenant_id=fold.tenant_id,
                        user_id=fold.user_id,
                        device_id=device,
                        event_id=str(entry.event_id),
                        mailbox_seq=entry.mailbox_seq,
                        kind="alert",
                        conversation_id=entry.conversation_id,
                        message_id=entry.message_id.hex(),
                        conversation_type=kinds.get(entry.conversation_id, "GROUP"),
                        counts_unread=True,
                        mention_type=_MENTIONS.get(entry.mention_type, "NONE"),
                        preview_or_placeholder=(
                            E2EE_PUSH_PLACEHOLDER if entry.conversation_id in encrypted else ""
                        ),
                        e2ee=entry.conversation_id in encrypted,
                        total_unread=b.total_unread,
                        total_mention=b.total_mention,
                        muted_unread=b.muted_unread,
                        badge_projection_mailbox_seq=b.badge_projection_mailbox_seq,
                        committed_at=entry.created_at,
                    )
                )
            if device not in on and not alerts and fold.badge_changed:
                tasks.append(
                    PushTask(
                        tenant_id=fold.tenant_id,
                        user_id=fold.user_id,
                        device_id=device,
                        event_id=f"badge:{b.badge_projection_mailbox_seq}",
                        mailbox_seq=b.badge_projection_mailbox_seq,
                        kind="badge",
                        total_unread=b.total_unread,
                        total_mention=b.total_mention,
                        muted_unread=b.muted_unread,
                        badge_projection_mailbox_seq=b.badge_projection_mailbox_seq,
                    )
                )
    return tasks, held


def task_key(task: PushTask) -> DeviceKey:
    return DeviceKey(task.tenant_id, task.user_id, task.device_id)
