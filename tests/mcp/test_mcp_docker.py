"""MCP servers inside the session's container on the real Docker engine: mcp-server-time and
mcp-server-git installed in the ``raygen-test/mcp`` image (.ci/build-test-images.sh), the scripted
misbehaving server bind-mounted in; the server's stdin is attached through the engine's socket."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest

from raygen.config import DockerEnvConfig
from raygen.envs import EnvSpec, create_environment, docker_engine
from raygen.envs.labels import LABEL_RUN
from raygen.errors import ConfigError
from raygen.tools.mcp_client import McpConnection
from raygen.tools.mcp_config import McpServerConfig
from tests.mcp.helpers import DONE, SERVERS, ListModel, call, mcp_runner, sample, tool_messages, turn

pytestmark = pytest.mark.docker

IMAGE = "raygen-test/mcp"
SCRIPTED = ["python3", "/servers/scripted_server.py"]


@pytest.fixture
def docker_config() -> DockerEnvConfig:
    import os

    if not os.environ.get("DOCKER_HOST"):
        pytest.skip('DOCKER_HOST is unset: eval "$(.ci/docker-setup.sh /tmp/rg-docker)" first')
    config = DockerEnvConfig(default_image=IMAGE, pull="never", mounts=[f"{SERVERS}:/servers:ro"])
    try:
        docker_engine.get_client(config).api.inspect_image(IMAGE)
    except Exception:
        pytest.skip(f"image {IMAGE} missing: run .ci/build-test-images.sh")
    return config


def run_containers(config: DockerEnvConfig, run_name: str) -> list[dict]:
    client = docker_engine.get_client(config)
    return client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={run_name}"})


async def test_time_server_runs_in_the_container(docker_config):
    model = ListModel([turn(call("time__get_current_time", {"timezone": "Europe/Paris"}, "t")), DONE])
    servers = {"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]}}
    runner = await mcp_runner(servers, docker_config, model)
    record = await runner.run(sample(["time"]))
    assert record.exit_status == "completed", record.error
    assert json.loads(tool_messages(record)["t"])["timezone"] == "Europe/Paris"
    assert record.tool_stats["time__get_current_time"].success == 1
    assert not run_containers(docker_config, "mcp-test")  # the session's container is gone


async def test_git_commit_lands_in_the_sessions_own_container(docker_config, tmp_path):
    setup = (
        "cd /work && git init -q && git config user.email t@e && git config user.name t && echo hi > a.txt"
    )

    def script(message: str) -> ListModel:
        return ListModel(
            [
                turn(call("terminal", {"command": setup}, "init")),
                turn(call("git__git_add", {"repo_path": "/work", "files": ["a.txt"]}, "add")),
                turn(call("git__git_commit", {"repo_path": "/work", "message": message}, "commit")),
                turn(call("terminal", {"command": "git -C /work log --format=%s; hostname"}, "log")),
                DONE,
            ]
        )

    runner = await mcp_runner({"git": {"command": "mcp-server-git"}}, docker_config, script("one"))
    first = await runner.run(sample(["terminal", "git"], key="a"))
    runner.model = script("two")
    second = await runner.run(sample(["terminal", "git"], key="b"))
    hosts = set()
    for record, message in ((first, "one"), (second, "two")):
        assert record.exit_status == "completed", record.error
        lines = json.loads(tool_messages(record)["log"])["output"].split("\n")
        assert lines[0] == message  # only its own commit
        hosts.add(lines[1])
    assert len(hosts) == 2  # two containers
    assert subprocess.run(["git", "-C", str(tmp_path), "log"], capture_output=True).returncode != 0


async def test_crash_in_the_container_is_mcp_server_lost_with_its_stderr(docker_config):
    model = ListModel([turn(call("s__crash", {}, "c")), DONE])
    runner = await mcp_runner({"s": {"command": SCRIPTED[0], "args": [SCRIPTED[1]]}}, docker_config, model)
    record = await runner.run(sample(["s"]))
    assert record.exit_status == "error:mcp_server_lost"
    assert "crashing now" in record.error


async def test_junk_and_hang_in_the_container(docker_config):
    model = ListModel([turn(call("s__echo", {"text": "hi"}, "e")), turn(call("s__hang", {}, "h")), DONE])
    server = {"command": SCRIPTED[0], "args": [SCRIPTED[1], "junk"]}
    runner = await mcp_runner({"s": server}, docker_config, model, mcp_call_timeout_s=1)
    record = await runner.run(sample(["s"]))
    assert tool_messages(record)["e"] == "hi"  # the junk lines were skipped
    assert record.exit_status == "error:mcp_server_lost" and "stopped answering" in record.error


async def test_closed_server_leaves_no_process_in_the_container(docker_config):
    spec = EnvSpec(session_key=f"mcp-{uuid.uuid4().hex[:8]}", run_name="mcp-test-close")
    async with create_environment(docker_config, spec) as env:
        server = McpServerConfig(command=SCRIPTED[0], args=[SCRIPTED[1], "child"])
        connection = await McpConnection.open("s", server, env, 30)
        pids = json.loads((await connection.call("pid", {}, 10)).content[0].text)
        assert pids["child"]
        await connection.close()
        deadline = time.monotonic() + 10
        while True:
            listing = await env.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", 10, 100_000)
            if "scripted_server" not in listing.stdout and "sleep 1000" not in listing.stdout:
                break
            assert time.monotonic() < deadline, listing.stdout
            await asyncio.sleep(0.2)
    assert not run_containers(docker_config, "mcp-test-close")


async def test_preflight_in_docker_names_a_missing_program(docker_config):
    with pytest.raises(ConfigError, match=r"'gone'.*(executable file not found|exit code 127)"):
        await mcp_runner({"gone": {"command": "no-such-server"}}, docker_config, ListModel([]))
