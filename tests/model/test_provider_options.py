"""Reasoning and routing options, spelled per provider, reach the HTTP body; context-length errors are
final."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from hostile_provider import HostileProvider

from raygen.config import OpenAIModelConfig, ProviderConfig, SamplingConfig
from raygen.errors import SessionFailure
from raygen.model.openai_model import OpenAIChatModel
from raygen.model.provider_options import api_style, request_options

OPENROUTER = "https://openrouter.ai/api/v1"


def test_reasoning_is_spelled_per_provider():
    high = ProviderConfig(reasoning_effort="high")
    assert request_options(high, OPENROUTER) == {"reasoning": {"effort": "high"}}
    assert request_options(high, "https://api.openai.com/v1") == {"reasoning_effort": "high"}
    off = ProviderConfig(reasoning=False)
    assert request_options(off, OPENROUTER) == {"reasoning": {"enabled": False}}
    assert request_options(off, "http://127.0.0.1:8000/v1") == {"reasoning_effort": "none"}
    forced = ProviderConfig(reasoning_effort="low", api_style="openrouter")
    assert request_options(forced, "http://127.0.0.1:8000/v1") == {"reasoning": {"effort": "low"}}
    assert request_options(ProviderConfig(), OPENROUTER) == {}
    assert api_style(ProviderConfig(), "https://openrouter.ai.evil.example/v1") == "openai"


def test_routing_maps_to_openrouter_provider_object():
    route = ProviderConfig(
        providers_allowed=["a", "b"],
        providers_ignored=["c"],
        providers_order=["b", "a"],
        provider_sort="price",
    )
    assert request_options(route, OPENROUTER) == {
        "provider": {"only": ["a", "b"], "ignore": ["c"], "order": ["b", "a"], "sort": "price"}
    }


def test_invalid_reasoning_options_are_refused():
    with pytest.raises(ValueError, match=r"literal_error|Input should be"):
        ProviderConfig(reasoning_effort="extreme")
    with pytest.raises(ValueError, match="contradicts"):
        ProviderConfig(reasoning=False, reasoning_effort="high")


def _reply_with_provider(name: str):
    async def step(request: web.Request, body: dict[str, Any]) -> web.Response:
        message = {"role": "assistant", "content": "hi"}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "provider": name,
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return step


async def _context_too_long(request: web.Request, body: dict[str, Any]) -> web.Response:
    message = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."
    error = {
        "error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    return web.json_response(error, status=int(request.headers["x-test-status"]))


async def test_options_reach_the_body_and_extra_body_wins():
    async with HostileProvider([_reply_with_provider("Upstream-B")]) as server:
        provider = ProviderConfig(reasoning_effort="medium", providers_order=["x"], api_style="openrouter")
        sampling = SamplingConfig(extra_body={"reasoning": {"effort": "high", "exclude": True}})
        config = OpenAIModelConfig(model="m", base_url=server.url)
        model = OpenAIChatModel(config, sampling, api_key="k", base_url=server.url, provider=provider)
        completion = await model.complete([{"role": "user", "content": "q"}], [])
        await model.aclose()
    body = json.loads(server.bodies[0])
    assert body["provider"] == {"order": ["x"]}
    assert body["reasoning"] == {"effort": "high", "exclude": True}  # the hand-written option wins
    assert completion.extra["provider"] == "Upstream-B"


@pytest.mark.parametrize("status", [400, 413])
async def test_context_length_errors_fail_at_once(status):
    async with HostileProvider([_context_too_long]) as server:
        config = OpenAIModelConfig(model="m", base_url=server.url, max_retries=5)
        model = OpenAIChatModel(config, SamplingConfig(), api_key="k", base_url=server.url)
        model.client = model.client.with_options(default_headers={"x-test-status": str(status)})
        with pytest.raises(SessionFailure) as info:
            await model.complete([{"role": "user", "content": "q"}], [])
        await model.aclose()
    assert info.value.kind == "context_length" and server.requests == 1  # final: not retried
