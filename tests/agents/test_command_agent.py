"""A real harness process (tests/agents/script_harness.py) as the session, on the local backend with and
without bubblewrap: the record built from its traffic, the key isolation, and every way it can end."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raygen.config import CommandAgentConfig, LocalEnvConfig, ScriptedModelConfig, SessionConfig, SimConfig
from raygen.envs.local import bwrap_problem
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.model.scripted import ScriptedModel
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "script_harness.py"
SIM = SimConfig(hallucinate_rate=0, no_reasoning_rate=0, reasoning_style="field")
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap unusable: {bwrap_problem()}")


def sample(prompt: str = "Check the environment.") -> Sample:
    return Sample(
        row=PromptRow(prompt=prompt), sample_key="s" * 24, prompt_index=0, line=1, toolsets=["terminal"]
    )


def runner(
    command: str, model: ChatModel | None = None, bwrap: bool = False, **session: Any
) -> SessionRunner:
    secrets = session.pop("secrets", None)
    return SessionRunner(
        model=model or ScriptedModel(ScriptedModelConfig(), SIM),
        registry=load_registry([]),
        env_config=LocalEnvConfig(bwrap=bwrap, bwrap_ro_binds=[str(HERE)]),
        session=SessionConfig(**session),
        agent=CommandAgentConfig(command=command),
        secret_values=secrets,
    )


def harness(*args: str) -> str:
    return shlex.join(["python3", str(HARNESS), *args])


async def run(runner: SessionRunner, row: Sample | None = None) -> dict[str, Any]:
    try:
        record = await runner.run(row or sample())
    finally:
        await runner.harness.aclose()
    return record.model_dump(mode="json")


@pytest.mark.parametrize(
    "bwrap,stream", [(False, False), (False, True), pytest.param(True, True, marks=needs_bwrap)]
)
async def test_a_harness_session_is_recorded_like_a_builtin_one(bwrap, stream):
    record = await run(runner(harness(*(["--stream"] if stream else [])), bwrap=bwrap))
    assert record["exit_status"] == "completed" and record["completed"], record["error"]
    assert record["api_calls"] == 3 and len(record["turns"]) == 3
    assert [m["role"] for m in record["messages"]] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    final = record["messages"][-1]["content"]
    assert "RAYGEN-VERIFY terminal=ok file=ok" in final  # a real shell and file system answered the calls
    assert record["tools_offered"] == ["read_file", "terminal", "write_file"]
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
    assert record["tool_stats"]["read_file"]["count"] == 1
    assert record["reasoning"] == {"with_reasoning": 3, "without_reasoning": 0}
    assert record["usage"]["prompt_tokens"] > 0 and record["toolsets_used"] == []
    assert [t["main"] for t in record["threads"]] == [True] and record["threads"][0]["calls"] == [0, 1, 2]
    assert record["conversations"][0]["from"] == "system" and "<tools>" in record["conversations"][0]["value"]
    agent = record["agent"]
    assert agent["type"] == "command" and agent["exit_code"] == 0 and "RAYGEN-VERIFY" in agent["stdout_tail"]


async def test_the_real_key_never_reaches_the_harness(tmp_path, monkeypatch):
    real = "sk-raygen-real-key-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", real)  # the worker's own environment holds it
    dump = tmp_path / "env.json"
    record = await run(runner(harness("--dump", str(dump)), secrets=[real]))
    assert record["exit_status"] == "completed"
    seen = json.loads(dump.read_text())
    assert real not in dump.read_text()
    assert seen["OPENAI_API_KEY"] != real and seen["ANTHROPIC_API_KEY"] == seen["OPENAI_API_KEY"]
    assert (
        seen["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
        and seen["RAYGEN_PROMPT"] == "Check the environment."
    )
    assert real not in json.dumps(record)


async def test_a_missing_command_is_agent_not_found():
    record = await run(runner("raygen-no-such-harness --go"))
    assert record["exit_status"] == "error:agent_not_found" and "raygen-no-such-harness" in record["error"]
    assert record["agent"]["exit_code"] == 127 and record["api_calls"] == 0


async def test_a_harness_that_never_calls_the_model():
    record = await run(runner("echo thinking about it"))
    assert record["exit_status"] == "error:agent_no_model_call"
    assert "thinking about it" in record["agent"]["stdout_tail"]


async def test_a_harness_that_crashes_without_an_answer_is_agent_failed():
    record = await run(runner(harness("--exit", "3")))
    assert record["exit_status"] == "error:agent_failed" and record["api_calls"] == 1
    assert record["agent"]["exit_code"] == 3 and len(record["messages"]) == 3  # the call and its answer kept


async def test_the_call_past_max_turns_is_refused_and_ends_the_session():
    record = await run(runner(harness("--forever"), max_turns=2))
    assert record["exit_status"] == "max_turns" and record["api_calls"] == 2
    assert record["agent"]["refused"] == "max_turns"
    assert "max_turns" in record["agent"]["stderr_tail"]  # the harness was told why


async def test_a_hanging_harness_is_killed_at_the_session_timeout():
    marker = "raygen-hang-7361"
    record = await run(runner(f"exec -a {marker} sleep 300", session_timeout_s=5))
    assert record["exit_status"] == "error:session_timeout"
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout == ""  # nothing of it is left running


class SlowModel(ChatModel):
    name = "slow"

    def __init__(self):
        self.inner = ScriptedModel(ScriptedModelConfig(), SIM)

    async def complete(self, messages, tools):
        await asyncio.sleep(2)
        return await self.inner.complete(messages, tools)


async def test_a_call_still_running_when_the_harness_exits_is_a_late_call():
    record = await run(runner(f"{harness()} & sleep 0.7; exit 0", model=SlowModel()))
    assert record["exit_status"] == "error:agent_late_call"


class WordyModel(ChatModel):
    name = "wordy"

    async def complete(self, messages, tools):
        return Completion(message={"role": "assistant", "content": "word " * 1000}, finish_reason="stop")


async def test_an_oversized_reply_is_stored_cut_and_fails_the_session():
    record = await run(runner(harness(), model=WordyModel(), max_reply_chars=1000))
    assert record["exit_status"] == "error:reply_too_large"
    assert record["messages"][-1]["content"].startswith("[raygen: reply of ")
    assert record["agent"]["exit_code"] == 0  # the harness had its answer


async def test_a_compacted_context_makes_a_second_thread_and_the_last_one_is_main():
    record = await run(runner(harness("--compact")))
    assert record["exit_status"] == "completed"
    first, second = record["threads"]
    assert first["calls"] == [0, 1] and not first["main"] and first["messages"][-1]["role"] == "assistant"
    assert second["calls"] == [2, 3, 4] and second["main"] and second["messages"] == []
    assert "(summary: tools ran)" in record["messages"][1]["content"]
    assert record["api_calls"] == 5 and record["usage"]["completion_tokens"] > 0


def test_the_forwarder_runs_on_the_oldest_supported_python_syntax():
    import ast

    source = (Path(__file__).resolve().parents[2] / "raygen" / "agents" / "forward.py").read_text()
    ast.parse(source, feature_version=(3, 8))  # it runs on whatever python3 the sandbox has
    assert "from raygen" not in source and sys.version_info >= (3, 8)


@pytest.mark.parametrize("mode", ["same", "fresh"])
async def test_the_hidden_check_grades_what_the_harness_left_behind(mode):
    check = {"command": "grep -q raygen-file- raygen_check_*.txt", "mode": mode}
    if mode == "fresh":  # a fresh environment sees only the declared artifacts
        check = {"command": "grep -q raygen-file- out.txt", "mode": mode, "artifacts": ["out.txt"]}
    row = Sample(
        row=PromptRow(prompt="Check the environment.", verify=check),
        sample_key="v" * 24,
        prompt_index=0,
        line=1,
        toolsets=["terminal"],
    )
    command = harness() + " && cp raygen_check_*.txt out.txt" if mode == "fresh" else harness()
    record = await run(runner(command), row)
    assert record["exit_status"] == "completed" and record["reward"] == 1.0, record["verification"]
    assert record["verification"]["mode"] == mode and record["verification"]["passed"]
