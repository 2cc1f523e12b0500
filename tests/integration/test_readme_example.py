"""The README's Python example, exactly as written, against the real stack (issue 14 item 7).

The script is cut out of README.md between its ``readme-example`` markers, so the README and
this test cannot drift; it runs as its own process (as a reader would run it) with alice's
token and ``QIM_URL`` pointing at the suite's gateway, after ``g:team`` was created with bob
as the README's ``qim group create`` does.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from pathlib import Path

import pytest

from qim.client import Identity
from qim.devstack.stack import Stack
from tests.integration.login_support import pipeline, syncing_gateway
from tests.integration.online_support import connect

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The one ```python block between the markers."""
    text = README.read_text()
    found = re.search(
        r"<!-- readme-example:begin -->\s*```python\n(.*?)```\s*<!-- readme-example:end -->",
        text,
        re.S,
    )
    assert found is not None, "README.md lost its readme-example markers"
    return found.group(1)


async def test_the_readme_python_example_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    tenant = f"t-readme-{uuid.uuid4().hex[:6]}"
    async with pipeline(stack, tmp_path), syncing_gateway(stack, "gw-readme") as gw:
        token = await gw.token("alice", "setup", tenant)
        setup = await connect(gw.ws_url, token, Identity(tenant, "alice"), "setup")
        try:
            await setup.result.client.create_group("g:team", ("bob",))
        finally:
            await setup.close()
        script = tmp_path / "example.py"
        script.write_text(readme_example())
        env = {**os.environ, "QIM_URL": gw.ws_url, "QIM_TENANT": tenant}
        env["PYTHONPATH"] = str(README.parent)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            await gw.token("alice", "phone", tenant),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    print(out.decode(), err.decode())
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert any(line.startswith("direct message at seq 1") for line in lines)
    sessions = next(line for line in lines if line.startswith("sessions:"))
    assert "g:team" in sessions
