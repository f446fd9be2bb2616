"""Whole sessions (no Ray) against a hostile provider over HTTP, tools on the local backend: counting,
size caps, an over-long command, host secrets read by a tool. Issue 15, cases 3, 5, 8 and 9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.config import LocalEnvConfig, OpenAIModelConfig, SamplingConfig, SessionConfig
from raygen.envs.local import bwrap_problem
from raygen.formats.limits import LARGE_ARGUMENT_CHARS
from raygen.input.rows import PromptRow, Sample
from raygen.model.openai_model import OpenAIChatModel
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry
from raygen.tools.terminal import MAX_COMMAND_BYTES
from tests.hostile_provider import HostileProvider, answer, huge_reply, status, tool_call


def sample() -> Sample:
    row = PromptRow(prompt="do the task")
    return Sample(row=row, sample_key="h" * 24, prompt_index=0, line=1, toolsets=["file", "terminal"])


async def run_session(script, tmp_path: Path, *, retries: int = 0, bwrap: bool = False, **session):
    async with HostileProvider(script) as provider:
        config = OpenAIModelConfig(base_url=provider.url, max_retries=retries, retry_max_wait_s=0.01)
        model = OpenAIChatModel(config, SamplingConfig(), api_key="sk-hostile-key", base_url=provider.url)
        runner = SessionRunner(
            model=model,
            registry=load_registry([]),
            env_config=LocalEnvConfig(root=tmp_path, bwrap=bwrap),
            session=SessionConfig(**session),
            secret_values=["sk-hostile-key"],
        )
        record = await runner.run(sample())
        await model.aclose()
    return record, provider


async def test_a_failed_call_counts_as_a_model_call(tmp_path: Path):
    script = [tool_call("terminal", {"command": "echo hi"}), status(503)]
    record, provider = await run_session(script, tmp_path, retries=3)
    assert record.exit_status == "error:provider_unavailable"
    assert provider.requests == 1 + 4  # one good call, then one call of four attempts
    assert record.api_calls == 2  # model calls, the failed one included (was 1: only the good one)
    assert "after 4 attempts" in record.error


async def test_a_session_failing_on_its_first_call_records_one_call(tmp_path: Path):
    record, provider = await run_session([status(500)], tmp_path, retries=2)
    assert record.exit_status == "error:provider_unavailable" and provider.requests == 3
    assert record.api_calls == 1


async def test_an_over_long_command_is_a_tool_error_shown_to_the_model(tmp_path: Path):
    command = "echo " + "x" * (5 * 1024 * 1024)
    script = [tool_call("terminal", {"command": command}), answer("gave up")]
    record, provider = await run_session(script, tmp_path)
    assert record.exit_status == "completed"  # not error:env_lost: the model's mistake, not the sandbox's
    assert record.tool_error_counts == {"invalid_arguments": 1}
    shown = json.loads(provider.bodies[1])["messages"][-1]
    assert shown["role"] == "tool" and f"{MAX_COMMAND_BYTES}-byte limit" in shown["content"]
    # Stored once: the raw messages keep the 5 MB argument, the ShareGPT copy a placeholder.
    assert len(record.messages[1]["tool_calls"][0]["function"]["arguments"]) > LARGE_ARGUMENT_CHARS
    gpt = next(t["value"] for t in record.conversations if t["from"] == "gpt")
    assert "stored once in messages" in gpt and len(gpt) < 1000
    assert len(record.model_dump_json()) < 6 * 1024 * 1024


async def test_a_command_just_under_the_limit_still_runs(tmp_path: Path):
    command = "echo ok #" + "x" * (MAX_COMMAND_BYTES - len("echo ok #"))
    record, _ = await run_session([tool_call("terminal", {"command": command}), answer()], tmp_path)
    assert record.tool_stats["terminal"].success == 1, record.messages[2]["content"][:300]


async def test_a_huge_reply_ends_the_session_with_reply_too_large(tmp_path: Path):
    record, _ = await run_session([huge_reply(1_000_000)], tmp_path, max_reply_chars=100_000)
    assert record.exit_status == "error:reply_too_large" and not record.completed
    assert "over 100000" in record.error and record.api_calls == 1
    assert len(record.model_dump_json()) < 20_000  # its head is kept, not a megabyte twice


async def test_a_record_over_the_cap_drops_its_conversation(tmp_path: Path):
    chunk = "y" * 30_000
    script = [tool_call("write_file", {"path": f"f{i}.txt", "content": chunk}) for i in range(3)]
    record, _ = await run_session([*script, answer()], tmp_path, max_record_bytes=64 * 1024)
    assert record.exit_status == "error:record_too_large"
    assert record.messages == [] and record.conversations == []
    assert "over session.max_record_bytes=65536" in record.error and "completed" in record.error
    assert record.api_calls == 4 and len(record.model_dump_json()) < 64 * 1024


async def test_a_host_secret_read_by_a_tool_is_redacted_in_the_record_and_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Named like a secret but in no secret_env list: a variable of the worker's environment, which a
    # command on the bare local backend can find (in /proc, in a host file such as this planted one).
    secret = "hostile-host-secret-4242"
    monkeypatch.setenv("RAYGEN_TEST_DEPLOY_TOKEN", secret)
    planted = tmp_path / "planted.env"
    planted.write_text(f"RAYGEN_TEST_DEPLOY_TOKEN={secret}\n")
    command = f"cat {planted}"
    record, provider = await run_session([tool_call("terminal", {"command": command}), answer()], tmp_path)
    assert record.tool_stats["terminal"].success == 1
    assert "RAYGEN_TEST_DEPLOY_TOKEN=[REDACTED]" in record.messages[2]["content"]
    assert secret not in record.model_dump_json()
    assert all(secret.encode() not in body for body in provider.bodies)


@pytest.mark.skipif(bwrap_problem() is not None, reason="bubblewrap unusable here")
async def test_read_file_of_proc_self_environ_under_bwrap_reveals_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The case: the file tool ran outside the sandbox and returned the worker's environment.
    monkeypatch.setenv("RAYGEN_TEST_PLAIN_VARIABLE", "visible-only-to-the-worker")
    script = [tool_call("read_file", {"path": "/proc/self/environ"}), answer()]
    record, provider = await run_session(script, tmp_path, bwrap=True)
    assert record.exit_status == "completed" and record.tool_error_counts == {"execution": 1}
    assert "no such file" in record.messages[2]["content"]
    assert all(b"visible-only-to-the-worker" not in body for body in provider.bodies)


async def test_an_over_long_search_pattern_is_a_tool_error_not_a_lost_environment(tmp_path: Path):
    script = [tool_call("search_files", {"pattern": "x" * 300_000}), answer()]
    record, _ = await run_session(script, tmp_path)
    assert record.exit_status == "completed" and record.tool_error_counts == {"execution": 1}
    assert "command line too long" in record.messages[2]["content"]
