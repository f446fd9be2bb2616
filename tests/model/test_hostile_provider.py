"""OpenAIChatModel against a hostile provider (tests/hostile_provider.py) over real HTTP: a trickling body,
bodies that are not a chat completion. Issue 15, cases 4 and 5."""

from __future__ import annotations

import time

import pytest

from raygen.config import OpenAIModelConfig, SamplingConfig
from raygen.errors import SessionFailure
from raygen.model.openai_model import OpenAIChatModel
from tests.hostile_provider import HostileProvider, answer, raw_body, trickle

MESSAGES = [{"role": "user", "content": "hello"}]


def model(url: str, **cfg) -> OpenAIChatModel:
    config = OpenAIModelConfig(**{"base_url": url, "max_retries": 0, "retry_max_wait_s": 0.05, **cfg})
    return OpenAIChatModel(config, SamplingConfig(), api_key="sk-test", base_url=url)


async def test_a_trickling_body_is_cut_at_the_timeout_and_retryable():
    # One byte a second: every read succeeds well within the timeout, the whole answer never comes.
    async with HostileProvider([trickle(interval_s=1.0)]) as provider:
        m = model(provider.url, timeout_s=3, max_retries=1)
        t0 = time.monotonic()
        with pytest.raises(SessionFailure) as info:
            await m.complete(MESSAGES, [])
        took = time.monotonic() - t0
        await m.aclose()
    assert info.value.kind == "provider_unavailable" and info.value.retryable
    assert "timeout_s=3" in info.value.detail
    assert provider.requests == 2  # each attempt cut at 3 s, then given up
    assert took < 2 * 3 + 4


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"id": "x", "choices": [{"message": ', id="truncated-json"),
        pytest.param(b"\xff\xfe\x00\x9c not utf-8 \xc3\x28", id="non-utf8"),
        pytest.param(b"[1, 2, 3]", id="json-but-not-a-completion"),
        pytest.param(b"null", id="json-null"),
    ],
)
async def test_a_body_that_is_not_a_completion_is_provider_malformed_and_retried(body: bytes):
    async with HostileProvider([raw_body(body)]) as provider:
        m = model(provider.url, max_retries=2)
        with pytest.raises(SessionFailure) as info:
            await m.complete(MESSAGES, [])
        await m.aclose()
    assert info.value.kind == "provider_malformed" and info.value.retryable
    assert provider.requests == 3  # retried like any transient provider error, not error:internal


async def test_one_malformed_body_then_a_good_answer_succeeds():
    async with HostileProvider([raw_body(b"{oops"), answer("fine")]) as provider:
        m = model(provider.url, max_retries=2)
        completion = await m.complete(MESSAGES, [])
        await m.aclose()
    assert completion.message["content"] == "fine" and provider.requests == 2
