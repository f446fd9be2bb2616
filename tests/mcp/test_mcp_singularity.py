"""MCP stdio servers inside a session's Apptainer instance (the HPC node fixture of
.ci/apptainer-setup.sh: real apptainer; the Debian image has python3, the scripted server is bound in)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from raygen.config import SingularityEnvConfig
from raygen.envs import EnvSpec, create_environment
from raygen.tools.mcp_client import McpConnection
from raygen.tools.mcp_config import McpServerConfig
from tests.mcp.helpers import DONE, SCRIPTED, ListModel, call, mcp_runner, sample, tool_messages, turn

sys.path.insert(0, str(Path(__file__).parents[1] / "envs"))
from test_singularity import DEBIAN, HPC_ROOT, apptainer_fixture

pytestmark = pytest.mark.singularity
SERVER = ["python3", "/servers/scripted_server.py"]


@pytest.fixture
def sing_config(tmp_path):
    executable, reason = apptainer_fixture()
    if reason:
        pytest.skip(reason)
    servers = HPC_ROOT / "mcp-servers"
    servers.mkdir(exist_ok=True)
    shutil.copy(SCRIPTED, servers / "scripted_server.py")
    root = HPC_ROOT / "work" / f"mcp-{uuid.uuid4().hex[:8]}"
    yield SingularityEnvConfig(
        executable=executable,
        root=root,
        default_image=str(DEBIAN),
        extra_args=["--bind", f"{servers}:/servers"],
    )
    shutil.rmtree(root, ignore_errors=True)


async def test_server_runs_in_the_instance_and_its_crash_is_mcp_server_lost(sing_config):
    model = ListModel(
        [turn(call("s__echo", {"text": "in the instance"}, "e")), turn(call("s__crash", {}, "c")), DONE]
    )
    runner = await mcp_runner({"s": {"command": SERVER[0], "args": SERVER[1:]}}, sing_config, model)
    record = await runner.run(sample(["s"]))
    assert tool_messages(record)["e"] == "in the instance"
    assert record.exit_status == "error:mcp_server_lost" and "crashing now" in record.error


async def test_closed_server_leaves_no_process_in_the_instance(sing_config):
    async with create_environment(sing_config, EnvSpec(session_key=f"m-{uuid.uuid4().hex[:6]}")) as env:
        connection = await McpConnection.open(
            "s", McpServerConfig(command=SERVER[0], args=[*SERVER[1:], "child"]), env, 60
        )
        assert json.loads((await connection.call("pid", {}, 30)).content[0].text)["child"]
        await connection.close()
        deadline = time.monotonic() + 15
        while True:
            listing = await env.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", 30, 100_000)
            if "scripted_server" not in listing.stdout and "sleep 1000" not in listing.stdout:
                break
            assert time.monotonic() < deadline, listing.stdout
            await asyncio.sleep(0.5)
