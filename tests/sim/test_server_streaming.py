"""The simulator's streamed answers, read by the real ``openai`` SDK; replies cut at ``max_tokens``."""

from __future__ import annotations

import json

import openai

from raygen.config import SimConfig
from raygen.model.sim_policy import respond
from raygen.sim.server import SimServer

MESSAGES = [{"role": "user", "content": "List the files here."}]
TERMINAL = {
    "type": "function",
    "function": {"name": "terminal", "description": "run", "parameters": {"type": "object"}},
}


async def test_stream_rebuilds_the_same_reply_as_a_plain_answer(tmp_path):
    cfg = SimConfig(
        latency_s=0, reasoning_style="field", provider_name="sim-upstream", log_path=tmp_path / "l"
    )
    async with SimServer(cfg) as sim:
        client = openai.AsyncOpenAI(api_key="x", base_url=sim.url, max_retries=0)
        plain = await client.chat.completions.create(model="m", messages=MESSAGES, tools=[TERMINAL])
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            tools=[TERMINAL],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
    assert len(chunks) > 4  # many events, not one
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    expected = plain.choices[0].message
    assert reasoning == expected.model_extra["reasoning_content"]
    assert calls[0].function.name == expected.tool_calls[0].function.name == "terminal"
    assert json.loads(arguments) == json.loads(expected.tool_calls[0].function.arguments)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[0].model_extra["provider"] == plain.model_extra["provider"] == "sim-upstream"
    logged = [json.loads(line) for line in (tmp_path / "l").read_text().splitlines()]
    assert [entry["options"].get("stream") for entry in logged] == [None, True]


def test_a_reply_over_max_tokens_is_cut_with_finish_reason_length():
    request = {"messages": MESSAGES, "tools": [TERMINAL]}
    full = respond(request, SimConfig())
    assert full.finish_reason == "tool_calls"
    cut = respond({**request, "max_tokens": 3}, SimConfig())
    assert cut.finish_reason == "length" and cut.completion_tokens == 3
    assert "tool_calls" not in cut.message and len(cut.message["content"]) <= 12
