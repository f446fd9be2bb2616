"""OpenAIChatModel against the real simulator over HTTP: retries, Retry-After, error classification."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from raygen.config import OpenAIModelConfig, SamplingConfig, SimConfig
from raygen.errors import SessionFailure
from raygen.model.openai_model import OpenAIChatModel
from raygen.sim.server import SimServer

MESSAGES = [{"role": "user", "content": "hello"}]


class SpyGate:
    def __init__(self):
        self.acquired = 0
        self.released: list[dict[str, Any]] = []

    async def acquire(self, est_tokens: int):
        self.acquired += 1
        return self.acquired

    def release(self, permit, **kw):
        self.released.append(kw)


def model(url: str, gate=None, **cfg: Any) -> OpenAIChatModel:
    config = OpenAIModelConfig(**{"base_url": url, "max_retries": 3, "retry_max_wait_s": 5, **cfg})
    return OpenAIChatModel(
        config,
        SamplingConfig(extra_body={"provider": {"only": ["x"]}}),
        api_key="sk-test",
        base_url=url,
        gate=gate,
    )


async def test_success_reports_usage_to_the_gate():
    gate = SpyGate()
    async with SimServer(SimConfig(latency_s=0)) as sim:
        m = model(sim.url, gate)
        completion = await m.complete(MESSAGES, [])
        await m.aclose()
    assert completion.message["role"] == "assistant" and completion.prompt_tokens > 0
    assert gate.acquired == 1 and gate.released[0]["status"] == 200
    assert gate.released[0]["prompt_tokens"] == completion.prompt_tokens


async def test_429_is_retried_after_retry_after():
    # one request per second, burst 1: the second call is answered 429 and must wait ~1 s
    gate = SpyGate()
    async with SimServer(SimConfig(latency_s=0, rate_limit_rpm=60, rate_limit_burst=1)) as sim:
        m = model(sim.url, gate)
        await m.complete(MESSAGES, [])
        t0 = time.monotonic()
        await m.complete(MESSAGES, [])
        waited = time.monotonic() - t0
        await m.aclose()
        stats = sim.stats.snapshot()
    statuses = [r["status"] for r in gate.released]
    assert 429 in statuses and statuses[-1] == 200
    assert any(r["retry_after_s"] and r["retry_after_s"] > 0 for r in gate.released if r["status"] == 429)
    assert waited >= 0.5  # honoured the hint instead of hammering
    assert stats["429"] == statuses.count(429)


async def test_persistent_5xx_fails_as_provider_unavailable():
    gate = SpyGate()
    async with SimServer(SimConfig(latency_s=0, error_rate=1.0)) as sim:
        m = model(sim.url, gate, max_retries=2, retry_max_wait_s=0.05)
        with pytest.raises(SessionFailure) as info:
            await m.complete(MESSAGES, [])
        await m.aclose()
    assert info.value.kind == "provider_unavailable" and info.value.retryable
    assert gate.acquired == 3 and all(r["status"] >= 500 for r in gate.released)


async def test_unknown_model_is_not_retried():
    gate = SpyGate()
    async with SimServer(SimConfig(latency_s=0)) as sim:
        m = model(sim.url, gate, model="nonexistent-model")
        with pytest.raises(SessionFailure) as info:
            await m.complete(MESSAGES, [])
        await m.aclose()
    assert info.value.kind == "provider_bad_request" and not info.value.retryable
    assert gate.acquired == 1


async def test_connection_refused_is_retried_then_fails():
    gate = SpyGate()
    m = model("http://127.0.0.1:9/v1", gate, max_retries=1, retry_max_wait_s=0.05)
    with pytest.raises(SessionFailure) as info:
        await m.complete(MESSAGES, [])
    await m.aclose()
    assert info.value.kind == "provider_unavailable" and gate.acquired == 2
    assert all(r["status"] is None for r in gate.released)


async def test_request_carries_sampling_and_extra_body():
    """The provider route and sampling options travel in the HTTP body exactly as configured."""
    from aiohttp import web

    bodies: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        config = OpenAIModelConfig(model="m", base_url=f"http://127.0.0.1:{port}/v1")
        sampling = SamplingConfig(
            max_tokens=7,
            temperature=0.3,
            seed=11,
            extra_body={"provider": {"order": ["a"], "allow_fallbacks": False}},
        )
        m = OpenAIChatModel(config, sampling, api_key="k", base_url=f"http://127.0.0.1:{port}/v1")
        await m.complete(MESSAGES, [])
        await m.aclose()
    finally:
        await runner.cleanup()
    body = bodies[0]
    assert body["provider"] == {"order": ["a"], "allow_fallbacks": False}
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (7, 0.3, 11)


async def test_max_connections_bounds_the_requests_in_flight():
    async with SimServer(SimConfig(latency_s=0.2)) as sim:
        m = model(sim.url, max_connections=2)
        await asyncio.gather(*(m.complete(MESSAGES, []) for _ in range(6)))
        await m.aclose()
        seen = sim.stats.max_in_flight
    assert seen == 2  # six callers, two connections: the other requests waited for one


def test_the_estimate_counts_each_schema_list_once_and_right():
    from raygen.model.openai_model import estimate_tokens

    messages = [{"role": "user", "content": "x" * 400}]
    tools = [{"type": "function", "function": {"name": "t", "description": "d" * 396}}]
    expected = (400 + len(str(tools[0]))) // 4 + 10
    assert estimate_tokens(messages, tools, 10) == expected
    assert estimate_tokens(messages, tools, 10) == expected  # from the cache
    bigger = [*tools, *tools]
    assert estimate_tokens(messages, bigger, 10) == (400 + 2 * len(str(tools[0]))) // 4 + 10
    assert estimate_tokens(messages, [], None) == 100 + 512
