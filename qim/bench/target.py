"""Where the system under test is and how the bench provisions it before measuring.

Everything goes through the operator's own surfaces: access tokens are minted with the key
ring that ``qim token issue`` and the gateway load (the stack's ``QIM_AUTH_KEYS_FILE``), groups
through the admin endpoint (``GroupAdminClient``), counters from the workers' metrics pages,
pids from the stack's pid files (the ones ``qim status`` reads). Nothing here is a
bench-only path into the server.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from qim.admin.client import GroupAdminClient
from qim.auth.config import AuthConfig, load_keyring
from qim.auth.tokens import TokenCodec
from qim.devstack import procs
from qim.devstack.stack import StackConfig

__all__ = ["Target", "scrape_counters"]

_TOKEN_TTL_MS = 3_600_000
_ADD_CHUNK = 500  # members per admin call: small requests, bounded server work each


@dataclass
class Target:
    """One stack: its gateway URL, admin endpoint, key ring, metrics pages and pid files."""

    ws_url: str
    admin_url: str
    admin_secret: str
    kafka_bootstrap: str
    env: dict[str, str]
    mailbox_metrics_urls: tuple[str, ...] = ()
    pid_files: dict[str, Path] = field(default_factory=dict)
    push_control_url: str = ""
    """The APNs / FCM stand-ins' control API (``qim bench push`` reads their receipts)."""
    _codec: TokenCodec | None = None

    @classmethod
    def from_stack(cls, cfg: StackConfig, ws_url: str | None = None) -> Target:
        """The stack ``qim up`` (or the test fixture) describes; pid files in its layout."""
        pid_files = {
            "kafka": cfg.kafka.pid_file,
            "redis": cfg.redis.pid_file,
            **{w.name: cfg.base_dir / "workers" / w.name / "worker.pid" for w in cfg.workers},
            **{g.name: cfg.base_dir / "gateways" / g.name / "gateway.pid" for g in cfg.gateways},
            **{a.name: cfg.base_dir / "admin" / a.name / "admin.pid" for a in cfg.admins},
        }
        mailbox = tuple(
            f"http://127.0.0.1:{w.web_port}/mailbox/metrics"
            for w in cfg.workers
            if w.module == "qim.apps.mailbox"
        )
        return cls(
            ws_url=ws_url or cfg.gateways[0].url,
            admin_url=cfg.admins[0].url if cfg.admins else "",
            admin_secret=cfg.admin_secret(),
            kafka_bootstrap=cfg.kafka.bootstrap,
            env={**os.environ, **cfg.env()},
            mailbox_metrics_urls=mailbox,
            pid_files=pid_files,
            push_control_url=cfg.push_standins.control_url,
        )

    def pids(self) -> dict[str, int]:
        """Live processes of the stack by name, plus ``bench`` (this process)."""
        found = {name: procs.read_pid(path) for name, path in self.pid_files.items()}
        return {name: pid for name, pid in found.items() if pid is not None} | {
            "bench": os.getpid()
        }

    def token(self, tenant: str, user: str, device: str) -> str:
        """An access token signed with the stack's key ring (what ``qim token issue`` prints)."""
        if self._codec is None:
            keyring, _ = load_keyring(self.env)
            config = AuthConfig.from_env(self.env)
            self._codec = TokenCodec(keyring, clock_skew_ms=config.clock_skew_ms)
        now_ms = time.time_ns() // 1_000_000
        return self._codec.issue_access(
            tenant, user, device, now_ms=now_ms, ttl_ms=_TOKEN_TTL_MS
        ).token

    async def create_group(
        self, tenant: str, group_id: str, owner: str, members: Sequence[str]
    ) -> None:
        """GroupAdd through the admin endpoint, in chunks (a 10,000-member group too)."""
        if not self.admin_url:
            raise RuntimeError("this target has no admin endpoint: groups cannot be provisioned")
        admin = GroupAdminClient(self.admin_url, self.admin_secret, actor="qim-bench")
        rest = [m for m in members if m != owner]
        await asyncio.to_thread(admin.create, tenant, group_id, owner, rest[:_ADD_CHUNK])
        for i in range(_ADD_CHUNK, len(rest), _ADD_CHUNK):
            await asyncio.to_thread(admin.add, tenant, group_id, rest[i : i + _ADD_CHUNK])

    async def mailbox_counters(self) -> dict[str, float]:
        """Counters summed over every mailbox worker and label set (empty if none answers)."""
        total: dict[str, float] = {}
        for url in self.mailbox_metrics_urls:
            for name, value in (await asyncio.to_thread(scrape_counters, url)).items():
                total[name] = total.get(name, 0.0) + value
        return total


def scrape_counters(url: str) -> dict[str, float]:
    """``name -> value`` summed over labels for every counter sample of a metrics page."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out
