"""Device-token lifecycle rules (spec 16.6) as pure functions; time is an argument.

* **Invalidation** by the provider (APNs 410 / BadDeviceToken, FCM UNREGISTERED /
  INVALID_ARGUMENT) is :func:`qim.core.notify.rules.classify`'s ``delete_token``; the service
  deletes at once, conditionally on the token that failed (its fingerprint).
* **GC**: a token whose ``last_success_at`` is older than ``push_token_inactive_days``
  (:func:`token_inactive`) is deleted with reason :data:`INACTIVE_REASON`
  (:func:`inactive_deletes`). The agent checks again when the delete command arrives, so a
  success or a re-registration recorded in between keeps the token.
* ``last_success_at`` moves on a delivered push, at most once per :data:`SUCCESS_RECORD_MS`
  per token (:func:`should_record_success`): GC needs day precision, not a changelog write
  per push. A registration sets it too (the app just ran, so the token is fresh).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from qim.schemas.records.notify import DeviceToken, DeviceTokenDelete

__all__ = [
    "DAY_MS",
    "INACTIVE_REASON",
    "SUCCESS_RECORD_MS",
    "inactive_deletes",
    "should_record_success",
    "token_inactive",
]

DAY_MS: Final = 86_400_000
SUCCESS_RECORD_MS: Final = DAY_MS
INACTIVE_REASON: Final = "inactive"
"""``DeviceTokenDelete.reason`` of a 16.6 GC deletion (``push_token_inactive_days``)."""


def token_inactive(last_success_at: int, now_ms: int, inactive_days: int) -> bool:
    """16.6 GC: ``last_success_at`` older than ``push_token_inactive_days`` (AT-117: 91 days
    -> deleted, 90 days exactly is not yet "older than")."""
    return now_ms - last_success_at > inactive_days * DAY_MS


def should_record_success(last_success_at: int, now_ms: int) -> bool:
    """Whether a delivered push should move ``last_success_at`` (module doc)."""
    return now_ms - last_success_at >= SUCCESS_RECORD_MS


def inactive_deletes(
    tokens: Iterable[DeviceToken], *, now_ms: int, inactive_days: int
) -> list[DeviceTokenDelete]:
    """The GC deletions of a sweep, in key order. Each is conditional on the token's
    fingerprint, and its request id is the token's and its ``last_success_at`` (a sweep that
    runs twice before the delete lands asks the same thing twice, idempotently)."""
    found = [t for t in tokens if token_inactive(t.last_success_at, now_ms, inactive_days)]
    return [
        DeviceTokenDelete(
            request_id=f"gc:{t.token_fingerprint}:{t.last_success_at}",
            tenant_id=t.tenant_id,
            user_id=t.user_id,
            device_id=t.device_id,
            reason=INACTIVE_REASON,
            token_fingerprint=t.token_fingerprint,
            at_ms=now_ms,
        )
        for t in sorted(found, key=lambda t: (t.tenant_id, t.user_id, t.device_id))
    ]
