"""Guards of the layout: import direction, forbidden entity aliases, a current topology.md.

Import direction (style.md item 2): schemas <- core <- agents / gateway / ops <- apps. The pure
layers (schemas, core, params) import no I/O library; only apps wire agents, tables and topics
together; ``ops`` (operator tools such as the audits) sits at the agents' level.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from qim import topology

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "qim"

IO_LIBS = {"asyncio", "faust", "mode", "aiokafka", "websockets", "redis", "rocksdict", "aiohttp"}

# layer -> qim subpackages it must not import
FORBIDDEN_QIM_IMPORTS: dict[str, set[str]] = {
    "schemas": {
        "core",
        "streams",
        "tables",
        "agents",
        "gateway",
        "apps",
        "devstack",
        "auth",
        "ops",
    },
    "core": {"streams", "tables", "agents", "gateway", "apps", "devstack", "auth", "ops"},
    "params": {"core", "streams", "tables", "agents", "gateway", "apps", "devstack", "auth", "ops"},
    "agents": {"apps", "gateway", "devstack", "ops"},
    "gateway": {"apps", "agents", "devstack", "ops"},
    "tables": {"apps", "agents", "gateway", "devstack", "ops"},
    "streams": {"apps", "agents", "gateway", "tables", "devstack", "ops"},
    # operator tools read what the agents write; nothing runs on top of them but the CLI
    "ops": {"apps", "gateway", "devstack"},
    # logs and the metric inventory: every process imports it, so it imports none of them
    "observability": {"apps", "agents", "gateway", "tables", "streams", "devstack", "auth", "ops"},
}
PURE_LAYERS = {"schemas", "core", "params"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _layer_files(layer: str) -> list[Path]:
    pkg = PKG / layer
    if pkg.is_dir():
        return sorted(pkg.rglob("*.py"))
    module = PKG / f"{layer}.py"
    return [module] if module.exists() else []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_QIM_IMPORTS))
def test_layers_import_only_downwards(layer: str) -> None:
    offenders = []
    for path in _layer_files(layer):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "qim" and len(parts) > 1 and parts[1] in FORBIDDEN_QIM_IMPORTS[layer]:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
            if layer in PURE_LAYERS and parts[0] in IO_LIBS:
                offenders.append(f"{path.relative_to(ROOT)} imports I/O library {name}")
    assert offenders == []


# Spec 5.1: the blocking alias regex of the CI alias check, applied to docs and code.
BLOCKING_ALIASES = re.compile(
    r"\bMessageNode\b|\bMailbox Node\b|\bMessage Store\b|\bconnection_epoch\b"
    r"|\bModeration/Admin|\bNotification Service\b"
)
WARNING_ALIASES = re.compile(
    r"\bConnection Gateway\b|\bConversation Writer\b|\bFanout Coordinator\b|\bGroup Membership\b"
    r"|\bShard Registry\b|\bSession Projection\b|\bRoom Writer\b|\bMedia Service\b|\bCommit Log\b"
    r"|\bMailbox Store\b"
)
ALIAS_TABLE = re.compile(r"<!-- alias-table:begin -->.*?<!-- alias-table:end -->", re.S)


def _project_texts() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "topology.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(PKG.rglob("*.py"))
    return [f for f in files if f.exists()]


def test_no_forbidden_entity_aliases() -> None:
    """Spec 5.1: one spelling per entity; the forbidden aliases never appear (this file aside)."""
    hits = []
    for path in _project_texts():
        text = ALIAS_TABLE.sub("", path.read_text())
        text = text.replace("Notification Service Extension", "<apple-api>")
        for pattern in (BLOCKING_ALIASES, WARNING_ALIASES):
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert hits == []


def test_topology_md_matches_the_code() -> None:
    assert topology.check(), "topology.md is stale: run `qim topology`"
