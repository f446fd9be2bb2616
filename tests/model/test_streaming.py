"""``provider.stream``: replies read as server-sent events from the simulator, idle timeout per chunk."""

from __future__ import annotations

import json
import time

import pytest

from raygen.config import OpenAIModelConfig, ProviderConfig, SamplingConfig, SimConfig
from raygen.errors import SessionFailure
from raygen.model.openai_model import OpenAIChatModel
from raygen.sim.server import SimServer

MESSAGES = [{"role": "user", "content": "List the files here."}]
TOOLS = [{"type": "function", "function": {"name": "terminal", "description": "run", "parameters": {}}}]


def model(url: str, provider: ProviderConfig, **cfg) -> OpenAIChatModel:
    config = OpenAIModelConfig(model="m", base_url=url, max_retries=1, retry_max_wait_s=0.1, **cfg)
    return OpenAIChatModel(config, SamplingConfig(), api_key="k", base_url=url, provider=provider)


async def test_streamed_reply_equals_the_plain_reply(tmp_path):
    log = tmp_path / "log.jsonl"
    cfg = SimConfig(latency_s=0, reasoning_style="field", provider_name="Up", log_path=log)
    async with SimServer(cfg) as sim:
        plain_model, stream_model = (
            model(sim.url, ProviderConfig()),
            model(sim.url, ProviderConfig(stream=True)),
        )
        plain = await plain_model.complete(MESSAGES, TOOLS)
        streamed = await stream_model.complete(MESSAGES, TOOLS)
        await plain_model.aclose()
        await stream_model.aclose()
    assert streamed.message == plain.message
    assert (
        (streamed.finish_reason, streamed.extra)
        == (plain.finish_reason, plain.extra)
        == ("tool_calls", {"provider": "Up"})
    )
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (
        plain.prompt_tokens,
        plain.completion_tokens,
    )
    sent = [json.loads(line)["options"] for line in log.read_text().splitlines()]
    assert sent == [{}, {"stream": True, "stream_options": {"include_usage": True}}]


async def test_a_stalled_stream_fails_by_its_idle_timeout_not_the_request_timeout():
    cfg = SimConfig(latency_s=0, stream_chunk_delay_s=0.5)
    async with SimServer(cfg) as sim:
        stalled = model(sim.url, ProviderConfig(stream=True, stream_idle_timeout_s=0.2), timeout_s=30)
        t0 = time.monotonic()
        with pytest.raises(SessionFailure) as info:
            await stalled.complete(MESSAGES, TOOLS)
        elapsed = time.monotonic() - t0
        await stalled.aclose()
        # Slow chunks within the idle timeout are fine, however long the whole reply takes.
        patient = model(sim.url, ProviderConfig(stream=True, stream_idle_timeout_s=2), timeout_s=30)
        completion = await patient.complete(MESSAGES, TOOLS)
        await patient.aclose()
    assert info.value.kind == "provider_unavailable" and "no stream chunk within 0.2 s" in str(info.value)
    assert elapsed < 5
    assert completion.finish_reason == "tool_calls"
