"""The body of ``qim audit dispatch``: configuration as the workers resolve it, report, exit code.

Exit status: 0 = no finding, 1 = findings (each printed), 2 = no verdict (a timeout waiting for
fanout or the MailboxNodes, or a topic missing). The configuration comes from the same
``Settings`` and environment the workers read (``QIM_<PARAM>``, ``QIM_TENANT_OVERRIDES``,
``QIM_MAILBOX_SHARD_EPOCH``), so the audit derives what the live pipeline derives.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from qim.agents.writer.options import tenant_settings
from qim.core.audit import DispatchAudit
from qim.core.fanout import FanoutConfig
from qim.core.mailbox import FIRST_SHARD_EPOCH, MailboxConfig
from qim.ops.audit import AuditIncomplete, AuditOptions, run_dispatch_audit, scope
from qim.params import Settings

__all__ = ["audit_options", "report_lines", "run_audit_cli"]

_SHOWN = 50


def audit_options(
    bootstrap: str, datadirs: Sequence[Path], tenants: Sequence[str], timeout: float
) -> AuditOptions:
    settings = Settings.load()
    overrides = tenant_settings(settings, os.environ.get("QIM_TENANT_OVERRIDES"))
    retention = {t: s.mailbox_retention_days for t, s in overrides.items()}
    return AuditOptions(
        bootstrap=bootstrap,
        datadirs=tuple(datadirs),
        fanout=FanoutConfig.from_settings(settings),
        mailbox=MailboxConfig.from_settings(settings, 0, tenant_retention_days=retention),
        tenants=scope(tenants),
        timeout_s=timeout,
        shard_epoch=int(os.environ.get("QIM_MAILBOX_SHARD_EPOCH", str(FIRST_SHARD_EPOCH))),
    )


def report_lines(report: DispatchAudit) -> list[str]:
    """A human summary: coverage, counts per kind, the first findings."""
    lines = [
        f"outbox records {report.outbox_records}, dispatch records {report.dispatch_records}",
        f"expected dispatches {report.expected_dispatches}, expected entries "
        f"{report.expected_entries}, entries seen {report.entries_seen}, excused {report.excused}",
        "findings: " + (", ".join(f"{k}={n}" for k, n in report.counts().items()) or "none"),
    ]
    for f in report.findings[:_SHOWN]:
        who = f" user {f.user}" if f.user else ""
        lines.append(f"  {f.kind} message {f.message_id} shard {f.shard}{who}: {f.detail}")
    if len(report.findings) > _SHOWN:
        lines.append(f"  ... {len(report.findings) - _SHOWN} more")
    return lines


def run_audit_cli(
    bootstrap: str, datadirs: Sequence[Path], tenants: Sequence[str], timeout: float, as_json: bool
) -> int:
    """Run the audit, print the report; the process exit status (module docstring)."""
    options = audit_options(bootstrap, datadirs, tenants, timeout)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        report = asyncio.run(run_dispatch_audit(options, say))
    except AuditIncomplete as exc:
        if as_json:
            print(json.dumps({"ok": False, "incomplete": str(exc)}))
        print(f"audit incomplete: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print("\n".join(report_lines(report)))
    return 0 if report.ok else 1
