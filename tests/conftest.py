"""Shared fixtures. The broker tier fails, never skips, when Kafka or Redis cannot start.

``QIM_TEST_BACKEND`` picks where Kafka and Redis come from (``tests/backends.py``): the
jar-started broker by default, or containers of the same versions (``testcontainers``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from qim.devstack.stack import Stack, StackConfig
from tests.backends import brokers_for, selected_backend


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private Kafka + Redis on free loopback ports, started once, stopped at the end."""
    base: Path = tmp_path_factory.mktemp("qim-stack")
    st = Stack(StackConfig().for_tests(base))
    brokers = brokers_for(selected_backend(os.environ), st)
    try:
        brokers.start()
        yield st
    finally:
        try:
            st.down()
        finally:
            brokers.stop()
