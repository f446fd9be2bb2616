"""Time a session spends held by the rate governor is not counted against ``session_timeout_s``
(raygen.model.gate_hold): sessions queued behind a paced limit finish; a slow model still times out.

Real parts: ``SessionRunner``, ``OpenAIChatModel`` over HTTP to a scripted provider, and the governor's
``GovernorClient`` + ``GovernorService`` in this process (no Ray)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from raygen.config import FakeEnvConfig, GovernorConfig, OpenAIModelConfig, SamplingConfig, SessionConfig
from raygen.distributed.governor import GovernorService
from raygen.distributed.governor_client import GovernorClient
from raygen.input.rows import PromptRow, Sample
from raygen.model import gate_hold
from raygen.model.openai_model import OpenAIChatModel
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry
from tests.hostile_provider import HostileProvider, answer


def _sample(prompt: str) -> Sample:
    return Sample(row=PromptRow(prompt=prompt), sample_key=prompt * 8, prompt_index=0, line=1, toolsets=[])


def _slow_answer(delay_s: float):
    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        return await answer()(request, body)

    return step


async def _run(script: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Every prompt of ``script`` as a session at once, all through one governor paced at 1 request/s."""
    gate = GovernorClient(GovernorService(GovernorConfig(rpm=60)), lookahead=False)
    async with HostileProvider(script) as provider:
        config = OpenAIModelConfig(base_url=provider.url, max_retries=0)
        model = OpenAIChatModel(config, SamplingConfig(), api_key="sk-t", base_url=provider.url, gate=gate)
        runner = SessionRunner(
            model=model,
            registry=load_registry([]),
            env_config=FakeEnvConfig(),
            session=SessionConfig(session_timeout_s=timeout_s),
        )
        records = await asyncio.gather(*(runner.run(_sample(p)) for p in script))
        await model.aclose()
    await gate.aclose()
    return dict(zip(script, records, strict=True))


async def test_sessions_held_by_the_governor_are_not_timed_out():
    # Three sessions of one call each, paced at one request a second: the last waits ~2 s for its
    # permit, twice its whole session_timeout_s, yet its own work takes milliseconds.
    t0 = time.monotonic()
    records = await _run({f"p{i}": [answer()] for i in range(3)}, timeout_s=1.0)
    took = time.monotonic() - t0
    print(f"\n3 sessions at 1 request/s, session_timeout_s=1: {took:.2f} s")
    assert took >= 1.8  # the pacing really held them (else this proves nothing)
    assert {r.exit_status for r in records.values()} == {"completed"}, {
        k: r.error for k, r in records.items()
    }


async def test_a_slow_model_still_times_out():
    records = await _run({"slow": [_slow_answer(2.0)]}, timeout_s=1.0)
    assert records["slow"].exit_status == "error:session_timeout"


async def test_the_deadline_stands_still_only_while_held():
    async with gate_hold.session_deadline(0.3) as clock:
        with gate_hold.held():
            await asyncio.sleep(0.5)
        await asyncio.sleep(0.1)
    assert clock.held_s == pytest.approx(0.5, abs=0.1)
    with pytest.raises(TimeoutError):
        async with gate_hold.session_deadline(0.3):
            with gate_hold.held():
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.4)  # 0.4 s unheld > 0.3 s
