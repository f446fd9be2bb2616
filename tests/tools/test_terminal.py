"""The terminal tool, on the fake backend (fast) and the local one (real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.config import FakeEnvConfig, LocalEnvConfig
from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.envs.fake import FakeEnvironment
from raygen.envs.local import LocalEnvironment
from raygen.tools.base import ToolContext
from raygen.tools.terminal import TerminalTool, terminal_toolset

TOOL = TerminalTool()


@pytest.fixture(params=["fake", "local"])
async def env(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "fake":
        environment = FakeEnvironment(FakeEnvConfig(), EnvSpec(session_key="term"))
    else:
        environment = LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="term"))
    async with environment:
        yield environment


class RecordingEnv(FakeEnvironment):
    """Remembers the timeout the tool asked for."""

    timeouts: list[float]

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        self.timeouts.append(timeout_s)
        return await super().exec(command, timeout_s, max_output_chars)


async def run(env: Environment, args: dict, **ctx) -> tuple[object, dict]:
    result = await TOOL.run(args, ToolContext(env=env, **ctx))
    return result, json.loads(result.content)


async def test_success_reports_output_and_exit_code(env: Environment):
    result, payload = await run(env, {"command": "printf 'raygen-%s-%d\\n' abcd1234 $((6*7))"})
    assert result.ok and result.error_kind is None
    assert payload == {"output": "raygen-abcd1234-42\n", "exit_code": 0}


async def test_failure_is_an_execution_error_with_both_streams(env: Environment):
    result, payload = await run(env, {"command": "echo partial; echo broken >&2; exit 4"})
    assert not result.ok and result.error_kind == "execution"
    assert payload["exit_code"] == 4
    assert "partial" in payload["output"] and "broken" in payload["output"]


async def test_timeout_is_a_timeout_error(env: Environment):
    result, payload = await run(env, {"command": "echo early; sleep 30", "timeout": 0.5})
    assert not result.ok and result.error_kind == "timeout"
    assert payload["timed_out"] is True


async def test_long_output_is_capped_and_flagged(env: Environment):
    result, payload = await run(env, {"command": "seq 1 100000"}, output_max_chars=1000)
    assert result.ok and payload["truncated"] is True
    assert len(result.content) <= 1000  # the whole JSON result, not only the output
    assert payload["output"].startswith("1\n2\n") and payload["output"].endswith("100000\n")


async def test_timeout_defaults_and_is_clamped():
    env = RecordingEnv(FakeEnvConfig(), EnvSpec(session_key="rec"))
    env.timeouts = []
    async with env:
        ctx = {"default_timeout_s": 7.0, "max_timeout_s": 30.0}
        await run(env, {"command": "true"}, **ctx)
        await run(env, {"command": "true", "timeout": 12}, **ctx)
        await run(env, {"command": "true", "timeout": 5000}, **ctx)
        await run(env, {"command": "true", "timeout": None}, **ctx)
    assert env.timeouts == [7.0, 12.0, 30.0, 7.0]


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"command": 42},
        {"command": "  "},
        {"command": "ls", "timeout": "10"},
        {"command": "ls", "timeout": -1},
        {"command": "ls", "timeout": True},
        {"command": "ls", "timeout": float("nan")},
    ],
)
async def test_invalid_arguments(env: Environment, args: dict):
    result, payload = await run(env, args)
    assert not result.ok and result.error_kind == "invalid_arguments" and payload["error"]


def test_toolset_shape():
    toolset = terminal_toolset()
    assert toolset.name == "terminal" and [tool.name for tool in toolset.tools] == ["terminal"]
    assert TOOL.schema()["function"]["parameters"]["required"] == ["command"]
