"""The session loop without Ray: scripted model or the real HTTP simulator, fake or local environment."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from raygen.config import FakeEnvConfig, LocalEnvConfig, ScriptedModelConfig, SessionConfig, SimConfig
from raygen.errors import SessionFailure
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.model.scripted import ScriptedModel
from raygen.model.sim_policy import plan_for
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry


def sample(prompt: str = "List the files here.", toolsets=("file", "terminal"), **row: Any) -> Sample:
    return Sample(
        row=PromptRow(prompt=prompt, **row),
        sample_key="k" * 24,
        prompt_index=0,
        line=1,
        toolsets=list(toolsets),
    )


def runner(model: ChatModel, env=None, **session: Any) -> SessionRunner:
    return SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=env or FakeEnvConfig(),
        session=SessionConfig(**session),
        secret_values=session.pop("secrets", None) if "secrets" in session else None,
    )


class ListModel(ChatModel):
    """Replies with the given assistant messages in order (a double of the Model seam)."""

    name = "list-model"

    def __init__(self, replies: list[dict[str, Any] | Exception]):
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    async def complete(self, messages, tools) -> Completion:
        self.seen.append([dict(m) for m in messages])
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return Completion(message=reply, prompt_tokens=10, completion_tokens=5)


def call(name: str, args: Any, cid: str = "c1") -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_scripted_session_runs_tools_and_verifies():
    s = sample()
    rec = await runner(ScriptedModel(ScriptedModelConfig(), SimConfig(reasoning_style="think"))).run(s)
    assert rec.completed and rec.exit_status == "completed"
    assert rec.messages[0] == {"role": "user", "content": s.row.prompt}
    assert "terminal=ok file=ok" in rec.messages[-1]["content"]
    assert rec.tool_stats["terminal"].success == 1
    assert rec.tool_stats["write_file"].count == 1 and rec.tool_stats["read_file"].count == 1
    assert rec.tool_stats["patch"].count == 0  # every known tool is present, zero-filled
    assert rec.reasoning.with_reasoning == rec.api_calls and rec.reasoning.without_reasoning == 0
    froms = [t["from"] for t in rec.conversations]
    assert froms[:3] == ["system", "human", "gpt"] and "tool" in froms
    assert "<tool_call>" in rec.conversations[2]["value"] and "<think>" in rec.conversations[2]["value"]


async def test_hallucinated_tool_is_answered_and_counted():
    cfg = SimConfig(hallucinate_rate=1.0)
    rec = await runner(ScriptedModel(ScriptedModelConfig(), cfg)).run(sample(toolsets=["terminal"]))
    assert rec.completed
    assert rec.hallucinated_tools and rec.tool_error_counts["hallucinated"] == len(rec.hallucinated_tools)
    tool_msgs = [m for m in rec.messages if m["role"] == "tool"]
    assert "unknown tool" in tool_msgs[0]["content"]


async def test_known_tool_not_offered_counts_as_hallucinated():
    model = ListModel(
        [
            {"role": "assistant", "tool_calls": [call("write_file", {"path": "a", "content": "b"})]},
            {"role": "assistant", "content": "done"},
        ]
    )
    rec = await runner(model).run(sample(toolsets=["terminal"]))
    assert rec.hallucinated_tools == ["write_file"]
    assert rec.tool_stats["write_file"].count == 0  # never executed


async def test_max_turns_ends_incomplete():
    rec = await runner(ScriptedModel(ScriptedModelConfig(), SimConfig()), max_turns=1).run(sample())
    assert not rec.completed and rec.exit_status == "max_turns" and rec.api_calls == 1
    # the last turn's calls were executed, so every tool call has its result
    assert rec.messages[-1]["role"] == "tool"


async def test_invalid_arguments_and_parallel_calls():
    model = ListModel(
        [
            {
                "role": "assistant",
                "tool_calls": [
                    call("terminal", "{not json", "a"),
                    call("terminal", {"command": "echo hi"}, "b"),
                ],
            },
            {"role": "assistant", "content": "ok"},
        ]
    )
    rec = await runner(model).run(sample())
    tool_msgs = [m for m in rec.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["a", "b"]
    assert "invalid arguments" in tool_msgs[0]["content"]
    assert json.loads(tool_msgs[1]["content"])["output"].strip() == "hi"
    assert rec.tool_error_counts == {"invalid_arguments": 1}
    assert rec.tool_stats["terminal"].count == 2 and rec.tool_stats["terminal"].failure == 1


async def test_provider_failure_ends_session_with_status():
    model = ListModel([SessionFailure("provider_auth", "HTTP 401: bad key")])
    rec = await runner(model).run(sample())
    assert rec.exit_status == "error:provider_auth" and not rec.completed and "401" in rec.error


async def test_bug_in_model_costs_one_session_not_the_run():
    model = ListModel([RuntimeError("boom")])
    rec = await runner(model).run(sample())
    assert rec.exit_status == "error:internal" and "boom" in rec.error


async def test_session_timeout():
    class Slow(ListModel):
        async def complete(self, messages, tools):
            await asyncio.sleep(5)

    rec = await runner(Slow([]), session_timeout_s=0.2).run(sample())
    assert rec.exit_status == "error:session_timeout"


async def test_secret_printed_by_a_tool_never_reaches_the_record():
    secret = "sk-live-0123456789abcdef"
    model = ListModel(
        [
            {"role": "assistant", "tool_calls": [call("terminal", {"command": f"echo {secret}"})]},
            {"role": "assistant", "content": f"the key is {secret}"},
        ]
    )
    r = SessionRunner(
        model=model,
        registry=load_registry([]),
        env_config=FakeEnvConfig(),
        session=SessionConfig(),
        secret_values=[secret],
    )
    rec = await r.run(sample())
    blob = rec.model_dump_json()
    assert secret not in blob and "[REDACTED]" in blob
    # the model saw the scrubbed tool output, so it could not learn the key from it
    tool_results_seen = [m for m in model.seen[1] if m["role"] == "tool"]
    assert tool_results_seen and secret not in json.dumps(tool_results_seen)


async def test_real_shell_through_http_simulator(tmp_path):
    """Local backend + the simulator over HTTP via the openai SDK: the nonce only appears if bash ran."""
    from raygen.config import SamplingConfig, SimModelConfig
    from raygen.model.openai_model import OpenAIChatModel
    from raygen.sim.server import SimServer

    cfg = SimConfig(latency_s=0.0, reasoning_style="field", log_path=tmp_path / "sim.jsonl")
    async with SimServer(cfg) as sim:
        model = OpenAIChatModel(SimModelConfig(), SamplingConfig(), api_key="x", base_url=sim.url)
        s = sample("Print hello in the shell.")
        rec = await runner(model, env=LocalEnvConfig(root=tmp_path)).run(s)
        await model.aclose()
    plan = plan_for(s.row.prompt, cfg)
    assert rec.completed and "terminal=ok file=ok" in rec.messages[-1]["content"]
    outputs = [m["content"] for m in rec.messages if m["role"] == "tool"]
    assert any(plan.terminal_token in o for o in outputs)
    assert all(m.get("reasoning_content") for m in rec.messages if m["role"] == "assistant")
    # the reasoning field went back to the provider on later turns
    log = [json.loads(line) for line in (tmp_path / "sim.jsonl").read_text().splitlines()]
    later = [entry for entry in log if entry["turn"] > 0]
    assert later and all(entry["decision"]["reasoning_passback"] is True for entry in later)
    assert not any(p.name.startswith("raygen-") for p in tmp_path.iterdir())  # workdir removed


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_fields_counted(field):
    model = ListModel([{"role": "assistant", "content": "hi", field: "because"}])
    rec = await runner(model).run(sample())
    assert rec.reasoning.with_reasoning == 1
    assert rec.conversations[-1]["value"].startswith("<think>\nbecause\n</think>")


async def test_environment_starts_at_the_first_tool_call_not_before(tmp_path):
    """A session waiting for the model (e.g. on the rate governor) holds no sandbox."""
    release = asyncio.Event()

    class Waiting(ListModel):
        async def complete(self, messages, tools):
            if len(self.seen) == 0:
                await release.wait()
            return await super().complete(messages, tools)

    model = Waiting(
        [
            {"role": "assistant", "tool_calls": [call("terminal", {"command": "pwd"})]},
            {"role": "assistant", "content": "done"},
        ]
    )
    task = asyncio.create_task(runner(model, env=LocalEnvConfig(root=tmp_path)).run(sample()))
    await asyncio.sleep(0.2)
    assert list(tmp_path.iterdir()) == []  # blocked in the first model call: no workdir yet
    release.set()
    rec = await task
    assert rec.completed and rec.tool_stats["terminal"].success == 1
    assert list(tmp_path.iterdir()) == []  # and it was removed at the end


async def test_no_tool_calls_means_no_environment(tmp_path):
    model = ListModel([{"role": "assistant", "content": "the answer is 4"}])
    rec = await runner(model, env=LocalEnvConfig(root=tmp_path / "never")).run(sample())
    assert rec.completed and rec.timing.env_setup_s == 0.0
    assert not (tmp_path / "never").exists()
