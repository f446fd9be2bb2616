"""Grading on a real Docker engine: both modes, tampering, a timeout, and no container left behind.

Needs ``eval "$(.ci/docker-setup.sh /tmp/rg-docker)"`` and ``.ci/build-test-images.sh`` (skipped otherwise).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from raygen.config import DockerEnvConfig
from raygen.envs import docker_engine
from raygen.session.agent import SessionRunner
from tests.verify.helpers import ToolScript, runner, sample_of, shell, solutions, task_rows, write

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from test_docker_engine import docker_skip_reason

pytestmark = pytest.mark.docker

ROW = {**task_rows()[1], "image": "raygen-test/python"}
RIGHT = solutions()[ROW["id"]]
WRONG = ROW["prompt"].split(":\n\n", 1)[1]
RUN_NAME = f"test-verify-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def docker_config() -> DockerEnvConfig:
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    return DockerEnvConfig(cpus=0.5, memory="256m", pids_limit=200)


def docker_runner(model, config) -> SessionRunner:
    r = runner(model, config)
    r.run_name = RUN_NAME
    return r


@pytest.mark.parametrize("mode", ["fresh", "same"])
async def test_rewards_in_both_modes(docker_config, mode):
    good = await docker_runner(ToolScript([[write("solution.py", RIGHT)]]), docker_config).run(
        sample_of(ROW, mode=mode)
    )
    bad = await docker_runner(ToolScript([[write("solution.py", WRONG)]]), docker_config).run(
        sample_of(ROW, mode=mode)
    )
    assert (good.exit_status, good.reward, good.verification.mode) == ("completed", 1.0, mode)
    assert good.env.backend == "docker" and good.artifacts[0].content == RIGHT
    assert (bad.exit_status, bad.reward) == ("completed", 0.0)


@pytest.mark.parametrize("mode", ["fresh", "same"])
async def test_hidden_files_are_hidden_and_tampering_does_not_pay(docker_config, mode):
    turns = [
        [shell("ls -a /work; cat test_hidden.py")],
        [
            write("solution.py", WRONG),
            write("test_hidden.py", "print('fine')\n"),
            shell("rm -f test_hidden.py"),
        ],
    ]
    model = ToolScript(turns)
    rec = await docker_runner(model, docker_config).run(sample_of(ROW, mode=mode))
    first_output = next(m["content"] for m in rec.messages if m["role"] == "tool")
    assert "No such file" in first_output and "def check" not in first_output
    assert rec.exit_status == "completed" and rec.reward == 0.0


async def test_fresh_mode_grades_in_a_new_container(docker_config):
    # The agent leaves a marker outside its artifacts; the check passes only where the marker is absent.
    turns = [[write("solution.py", RIGHT), shell("touch /work/agent_was_here")]]
    command = "test ! -e agent_was_here && python3 test_hidden.py"
    fresh = await docker_runner(ToolScript(turns), docker_config).run(sample_of(ROW, command=command))
    same = await docker_runner(ToolScript([list(t) for t in turns]), docker_config).run(
        sample_of(ROW, command=command, mode="same")
    )
    assert fresh.reward == 1.0 and same.reward == 0.0


async def test_timeout_is_a_verify_error_and_no_container_is_left(docker_config):
    rec = await docker_runner(ToolScript([[write("solution.py", RIGHT)]]), docker_config).run(
        sample_of(ROW, command="sleep 60", timeout_s=1)
    )
    assert rec.exit_status == "error:verify_error" and rec.reward is None and "timed out" in rec.error
    client = docker_engine.get_client(docker_config)
    left = [c for c in client.api.containers(all=True) if RUN_NAME in (c.get("Labels") or {}).values()]
    assert left == []
