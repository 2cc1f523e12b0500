"""Audits of the running pipeline against its source log (spec 0.2 orphan audit, 19.1).

* ``dispatch`` -- :func:`audit_dispatch`: the outbox (commit facts) against the dispatch log
  and the MailboxStores; the pure half of ``qim audit dispatch`` (``qim.ops.audit``).
* ``expected`` -- :func:`expected_entries`: every recipient entry a window of the outbox requires.
"""

from qim.core.audit.dispatch import ENTRY_COORDINATES, AuditFinding, DispatchAudit, audit_dispatch
from qim.core.audit.expected import EntryKey, Expected, ExpectedEntry, expected_entries

__all__ = [
    "ENTRY_COORDINATES",
    "AuditFinding",
    "DispatchAudit",
    "EntryKey",
    "Expected",
    "ExpectedEntry",
    "audit_dispatch",
    "expected_entries",
]
