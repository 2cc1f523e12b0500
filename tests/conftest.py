"""Shared fixtures. The broker tier fails, never skips, when Kafka or Redis cannot start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qim.devstack.stack import Stack, StackConfig


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private Kafka + Redis on free loopback ports, started once, stopped at the end."""
    base: Path = tmp_path_factory.mktemp("qim-stack")
    st = Stack(StackConfig().for_tests(base))
    try:
        st.start_services()
        yield st
    finally:
        st.down()
