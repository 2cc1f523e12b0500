"""style.md item 1: the codec is sans-I/O - no event loop, broker, socket or store imports."""

from __future__ import annotations

import ast
from pathlib import Path

import qim.schemas.frames

FORBIDDEN = {"asyncio", "faust", "aiokafka", "websockets", "redis", "rocksdict", "socket", "ssl"}


def test_frames_package_imports_no_io() -> None:
    package = Path(qim.schemas.frames.__file__).parent
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & FORBIDDEN, f"{path.name}: imports {roots & FORBIDDEN}"


def test_public_surface_is_explicit() -> None:
    exported = set(qim.schemas.frames.__all__)
    assert len(exported) == len(qim.schemas.frames.__all__)
    for name in exported:
        assert hasattr(qim.schemas.frames, name), name
