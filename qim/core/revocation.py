"""Which live sessions a committed revocation ends (15.3.2, 20.3.2): the login check's rule,
applied to the connections a gateway holds (``qim.gateway.revocations``)."""

from __future__ import annotations

from qim.schemas.records.revocation import RevocationNotice

__all__ = ["revocation_hits"]


def revocation_hits(
    notice: RevocationNotice,
    *,
    tenant_id: str,
    user_id: str,
    device_id: str,
    token_id: str | None,
    token_issued_at_ms: int | None,
) -> bool:
    """Whether a live session bound to this identity and token is revoked by ``notice``.

    The same rule as the login check: a token id matches exactly; a device or user watermark
    revokes every token issued at or before it (a token issued later, after a new login, stays).
    A session whose token facts are unknown is revoked by any watermark of its identity.
    """
    if notice.scope == "token":
        return token_id is not None and token_id == notice.token_id
    if (notice.tenant_id, notice.user_id) != (tenant_id, user_id):
        return False
    if notice.scope == "device" and notice.device_id != device_id:
        return False
    return token_issued_at_ms is None or token_issued_at_ms <= notice.revoked_at
