"""A governed worker against a provider answering one 503 with ``Retry-After: 100000`` (issue 15, case 1):
one answer pauses neither the worker's gate nor the governor (issue 24: a pause needs several refusals,
and lasts at most ``governor.max_pause_s``); only its own retry waits. No Ray cluster."""

from __future__ import annotations

import asyncio
import time

from raygen.config import GovernorConfig, OpenAIModelConfig, SamplingConfig
from raygen.distributed.governor import GovernorService
from raygen.distributed.governor_client import GovernorClient
from raygen.model.openai_model import OpenAIChatModel
from tests.hostile_provider import HostileProvider, answer, status

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_an_absurd_retry_after_pauses_the_gate_at_most_max_pause_s():
    config = GovernorConfig(rpm=600, max_pause_s=1.0)
    gate = GovernorClient(GovernorService(config), max_pause_s=config.max_pause_s)
    async with HostileProvider([status(503, {"Retry-After": "100000"}), answer("ok")]) as provider:
        model_config = OpenAIModelConfig(base_url=provider.url, max_retries=2, retry_max_wait_s=0.5)
        m = OpenAIChatModel(model_config, SamplingConfig(), api_key="sk-t", base_url=provider.url, gate=gate)
        t0 = time.monotonic()
        # Bounded: an uncapped pause would hang here for 100000 s.
        first = await asyncio.wait_for(m.complete(MESSAGES, []), 10)
        second = await asyncio.wait_for(m.complete(MESSAGES, []), 10)  # the worker is not frozen either
        took = time.monotonic() - t0
        await m.aclose()
    await gate.aclose()
    assert first.message["content"] == second.message["content"] == "ok"
    assert provider.requests == 3
    assert took < 5, f"the gate honoured the 100000 s Retry-After ({took:.1f} s)"
