"""The presets: what they run, and the real harnesses from PyPI run by them as sessions (no Ray)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import AGENTS, CLAUDE, CODEX, HERMES, MINI, need

from raygen.agents.presets import harness_command, harness_env
from raygen.config import (
    ClaudeCodeAgentConfig,
    CodexAgentConfig,
    HermesAgentConfig,
    LocalEnvConfig,
    MiniSweAgentConfig,
    ScriptedModelConfig,
    SessionConfig,
    SimConfig,
)
from raygen.envs.local import bwrap_problem
from raygen.input.rows import PromptRow, Sample
from raygen.model.scripted import ScriptedModel
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

SIM = SimConfig(hallucinate_rate=0, no_reasoning_rate=0, reasoning_style="field")


def test_hermes_gets_a_config_pointing_at_the_proxy_and_runs_one_shot():
    command = harness_command(HermesAgentConfig(executable="/opt/h/bin/hermes", toolsets="terminal,file"))
    assert "base_url: $OPENAI_BASE_URL" in command and "api_key: $OPENAI_API_KEY" in command
    assert "default: $RAYGEN_MODEL" in command and "provider: custom" in command
    assert command.endswith("exec /opt/h/bin/hermes chat -q {prompt} -Q --yolo --toolsets terminal,file")


def test_mini_swe_agent_is_told_the_proxy_and_needs_no_setup_or_price_list():
    config = MiniSweAgentConfig(extra_args=["--agent-class", "default"], env={"X": "1"})
    command = harness_command(config)
    assert command.startswith("exec mini -y --exit-immediately -t {prompt}")
    assert '"model.model_kwargs.api_base=$OPENAI_BASE_URL"' in command and "-l 0" in command
    assert command.endswith(" --agent-class default")
    env = harness_env(config)
    assert env["MSWEA_CONFIGURED"] == "true" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["X"] == "1"


async def run(agent: Any, bwrap: bool) -> dict[str, Any]:
    runner = SessionRunner(
        model=ScriptedModel(ScriptedModelConfig(), SIM),
        registry=load_registry([]),
        env_config=LocalEnvConfig(bwrap=bwrap, bwrap_ro_binds=[str(AGENTS)]),
        session=SessionConfig(max_turns=8, session_timeout_s=240),
        agent=agent,
    )
    row = Sample(row=PromptRow(prompt="Check the environment."), sample_key="p" * 24, prompt_index=0, line=1,
                 toolsets=["terminal"])  # fmt: skip
    try:
        return (await runner.run(row)).model_dump(mode="json")
    finally:
        await runner.harness.aclose()


def bwrap_or_skip(bwrap: bool) -> None:
    if bwrap and bwrap_problem():
        pytest.skip(f"bwrap unusable: {bwrap_problem()}")


@pytest.mark.parametrize("bwrap", [False, True])
async def test_mini_swe_agent_session(bwrap):
    need(MINI)
    bwrap_or_skip(bwrap)
    record = await run(MiniSweAgentConfig(executable=str(MINI)), bwrap)
    assert record["exit_status"] == "completed", (record["error"], record["agent"])
    assert record["tools_offered"] == ["bash"] and record["tool_stats"]["bash"]["success"] == 2
    assert record["agent"]["exit_code"] == 0
    final = record["messages"][-1]
    assert "RAYGEN-VERIFY terminal=ok" in final["content"]  # mini ran the probe in a real shell
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in final["tool_calls"][0]["function"]["arguments"]


@pytest.mark.slow
@pytest.mark.parametrize("bwrap", [False, True])
async def test_hermes_agent_session(bwrap):
    need(HERMES)
    bwrap_or_skip(bwrap)
    record = await run(HermesAgentConfig(executable=str(HERMES)), bwrap)
    assert record["exit_status"] == "completed", (record["error"], record["agent"])
    assert {"terminal", "read_file", "write_file", "memory"} <= set(record["tools_offered"])  # Hermes's own
    assert record["api_calls"] == 3 and record["reasoning"]["with_reasoning"] == 3
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
    assert "RAYGEN-VERIFY terminal=ok file=ok" in record["messages"][-1]["content"]
    assert record["messages"][0]["role"] == "system" and len(record["messages"][0]["content"]) > 1000


def test_claude_code_runs_one_shot_without_prompts_or_outside_traffic():
    config = ClaudeCodeAgentConfig(executable="/opt/c/claude", extra_args=["--max-turns", "5"])
    assert (
        harness_command(config)
        == "exec /opt/c/claude -p {prompt} --dangerously-skip-permissions --max-turns 5"
    )
    env = harness_env(config)
    assert env["IS_SANDBOX"] == "1" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


@pytest.mark.parametrize("bwrap", [False, True])
async def test_claude_code_session_through_the_messages_endpoint(bwrap):
    need(CLAUDE)
    bwrap_or_skip(bwrap)
    record = await run(ClaudeCodeAgentConfig(executable=str(CLAUDE)), bwrap)
    assert record["exit_status"] == "completed", (record["error"], record["agent"])
    assert {"Bash", "Read", "Write", "Edit"} <= set(record["tools_offered"])  # Claude Code's own tools
    assert record["tool_stats"]["Bash"] == {"count": 1, "success": 1, "failure": 0}
    final = record["messages"][-1]["content"]
    assert "RAYGEN-VERIFY terminal=ok" in final  # its Bash tool ran the probe in a real shell
    assert final in record["agent"]["stdout_tail"]  # and it printed the answer it got


def test_codex_gets_a_provider_on_the_responses_endpoint():
    command = harness_command(CodexAgentConfig(executable="/opt/x/codex"))
    assert 'base_url = "$OPENAI_BASE_URL"' in command and 'wire_api = "responses"' in command
    assert 'env_key = "OPENAI_API_KEY"' in command and 'model = "$RAYGEN_MODEL"' in command
    assert command.endswith(
        "exec /opt/x/codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox {prompt}"
    )


@pytest.mark.parametrize("bwrap", [False, True])
async def test_codex_session_through_the_responses_endpoint(bwrap):
    need(CODEX)
    bwrap_or_skip(bwrap)
    record = await run(CodexAgentConfig(executable=str(CODEX)), bwrap)
    assert record["exit_status"] == "completed", (record["error"], record["agent"])
    assert "exec_command" in record["tools_offered"]  # Codex's own shell tool
    assert record["tool_stats"]["exec_command"] == {"count": 1, "success": 1, "failure": 0}
    assert "raygen-" in record["messages"][-2]["content"]  # the probe's output came from a real shell
    assert "RAYGEN-VERIFY terminal=ok" in record["messages"][-1]["content"]
