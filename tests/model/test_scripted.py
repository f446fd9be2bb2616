"""ScriptedModel: the simulator's policy in-process, replying exactly as the HTTP simulator does."""

from __future__ import annotations

import json

import openai
import pytest

from raygen.config import ScriptedModelConfig, SimConfig
from raygen.errors import SessionFailure
from raygen.model.base import ChatModel, Completion
from raygen.model.scripted import ScriptedModel
from raygen.model.sim_policy import NONEXISTENT_MODEL_PREFIX, plan_for
from raygen.sim.server import SimServer

TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object"}}}
    for n in ("terminal", "write_file", "read_file")
]


def execute(name: str, args: dict, files: dict[str, str], nonce: str) -> str:
    """A stand-in tool side that answers correctly (the shell part is proven in tests/sim)."""
    if name == "terminal":
        return json.dumps({"output": f"raygen-{nonce}-42\n"})
    if name == "write_file":
        files[args["path"]] = args["content"]
        return json.dumps({"ok": True})
    if name == "read_file":
        return json.dumps({"content": files.get(args["path"], "")})
    return json.dumps({"error": f"unknown tool {name}"})


async def run_session(call, prompt: str, cfg: SimConfig) -> list[dict]:
    """Drive a session with ``call(messages) -> (message dict, finish_reason)``; return the messages."""
    nonce = plan_for(prompt, cfg).nonce
    files: dict[str, str] = {}
    messages: list[dict] = [{"role": "user", "content": prompt}]
    for _ in range(8):
        message, finish = await call(messages)
        messages.append(message)
        if finish == "stop":
            return messages
        for tc in message["tool_calls"]:
            args = json.loads(tc["function"]["arguments"])
            out = execute(tc["function"]["name"], args, files, nonce)
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": out})
    raise AssertionError("session did not finish")


async def test_complete_runs_the_script_to_a_verified_answer():
    model = ScriptedModel(ScriptedModelConfig())
    assert isinstance(model, ChatModel) and model.name == "raygen-scripted"

    async def call(messages):
        completion = await model.complete(messages, TOOLS)
        assert isinstance(completion, Completion)
        assert completion.prompt_tokens >= 1 and completion.completion_tokens >= 1
        return completion.message, completion.finish_reason

    messages = await run_session(call, "scripted prompt", SimConfig())
    assert "RAYGEN-VERIFY terminal=ok file=ok" in messages[-1]["content"]


@pytest.mark.parametrize("style", ["field", "think"])
async def test_messages_equal_what_the_http_path_yields(style):
    """Same dicts as the openai SDK's ``model_dump(exclude_none=True)`` of the simulator's replies."""
    cfg = SimConfig(latency_s=0.0, reasoning_style=style, hallucinate_rate=1.0, seed=9)
    model = ScriptedModel(ScriptedModelConfig(), sim=cfg)

    async def in_process(messages):
        completion = await model.complete(messages, TOOLS)
        return completion.message, completion.finish_reason

    async with SimServer(cfg) as sim, openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0) as ai:

        async def over_http(messages):
            resp = await ai.chat.completions.create(model="raygen-scripted", messages=messages, tools=TOOLS)
            choice = resp.choices[0]
            return choice.message.model_dump(exclude_none=True), choice.finish_reason

        wire = await run_session(over_http, "same prompt", cfg)
    local = await run_session(in_process, "same prompt", cfg)
    assert local == wire
    assert len(local) > 4  # hallucination, probe, read back and the answer all happened


async def test_sim_config_drives_the_plan():
    cfg = SimConfig(no_reasoning_rate=1.0, hallucinate_rate=1.0)
    model = ScriptedModel(ScriptedModelConfig(latency_s=0.01), sim=cfg)
    completion = await model.complete([{"role": "user", "content": "q"}], TOOLS)
    assert completion.message["tool_calls"][0]["function"]["name"] not in {
        "terminal",
        "write_file",
        "read_file",
    }
    assert "reasoning_content" not in completion.message and "content" not in completion.message


async def test_nonexistent_model_fails_like_a_404():
    model = ScriptedModel(ScriptedModelConfig(model="nonexistent-x"))
    with pytest.raises(SessionFailure) as err:
        await model.complete([{"role": "user", "content": "q"}], [])
    assert err.value.kind == "provider_bad_request" and not err.value.retryable


class RecordingGate:
    """A rate gate that admits everything and remembers what it was told (the governor's seam)."""

    def __init__(self) -> None:
        self.acquired: list[int] = []
        self.released: list[dict] = []

    async def acquire(self, est_tokens: int) -> object:
        self.acquired.append(est_tokens)
        return len(self.acquired)

    def release(self, permit: object, **report: object) -> None:
        self.released.append({"permit": permit, **report})


async def test_each_call_goes_through_the_gate_like_an_http_call():
    gate = RecordingGate()
    model = ScriptedModel(ScriptedModelConfig(), gate=gate)
    got = await model.complete([{"role": "user", "content": "List the files."}], TOOLS)
    assert gate.acquired and gate.acquired[0] > 0
    tokens = {"prompt_tokens": got.prompt_tokens, "completion_tokens": got.completion_tokens}
    assert gate.released == [{"permit": 1, "status": 200, **tokens}]
    failing = ScriptedModel(ScriptedModelConfig(model=NONEXISTENT_MODEL_PREFIX + "x"), gate=gate)
    with pytest.raises(SessionFailure):
        await failing.complete([{"role": "user", "content": "x"}], TOOLS)
    assert gate.released[-1] == {"permit": 2, "status": 404}  # handed back however the call ends
