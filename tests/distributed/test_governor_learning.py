"""Learning a rate limit from refusals alone (issue 24): the simulator sends no ``x-ratelimit-*`` headers,
only 429 + ``Retry-After``, and the governor is told nothing. Real parts: the simulator over HTTP,
``OpenAIChatModel`` with its retries, ``GovernorClient`` + ``GovernorService`` in this process (no Ray).

Once the first 429s have been answered and their pause served, the provider's limit is used at >= 85%
with few 429s, counted as a token bucket and as fixed and sliding windows of one second (the bench's
matrix has every kind at full size: bench/README.md)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from raygen.config import GovernorConfig, OpenAIModelConfig, SamplingConfig, SimConfig
from raygen.distributed.governor import GovernorService
from raygen.distributed.governor_client import GovernorClient
from raygen.model.openai_model import OpenAIChatModel
from raygen.sim.server import SimServer

LIMIT_RPM = 600.0  # 10 requests a second: light for a shared machine, far below what 32 callers want
JOB_S = 14.0
SETTLED_AFTER_S = 4.0
"""Figures count from this long after the first 429: the settling pause and the first cut are over."""
MESSAGES = [{"role": "user", "content": "print 1 in the shell"}]


async def _job(kind: str, log_path: Path) -> list[dict]:
    sim_cfg = SimConfig(
        latency_s=0.05,
        rate_limit_rpm=LIMIT_RPM,
        rate_limit_kind=kind,
        rate_limit_window_s=1.0,
        rate_limit_headers=False,
        log_path=log_path,
    )
    gate = GovernorClient(GovernorService(GovernorConfig()))  # nothing configured: learn
    async with SimServer(sim_cfg) as sim:
        config = OpenAIModelConfig(base_url=sim.url, max_retries=50, retry_max_wait_s=5)
        model = OpenAIChatModel(config, SamplingConfig(), api_key="sk-t", base_url=sim.url, gate=gate)
        deadline = time.monotonic() + JOB_S

        async def caller() -> None:
            while time.monotonic() < deadline:
                await model.complete(MESSAGES, [])

        await asyncio.gather(*(caller() for _ in range(32)))
        await model.aclose()
    await gate.aclose()
    return [json.loads(line) for line in log_path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["token_bucket", "fixed_window", "sliding_window"])
async def test_a_limit_is_learned_from_429s_alone(kind, tmp_path):
    requests = await _job(kind, tmp_path / "sim.jsonl")
    first_429 = min(r["ts"] for r in requests if r["status"] == 429)
    start = first_429 + SETTLED_AFTER_S
    settled = [r for r in requests if r["ts"] >= start]
    end = max(r["ts"] for r in settled)
    passed = sum(r["status"] == 200 for r in settled)
    limited = sum(r["status"] == 429 for r in settled)
    utilization = passed / (LIMIT_RPM / 60 * (end - start))
    share_429 = limited / len(settled)
    print(
        f"\n{kind} 1 s, headers off, nothing configured: {utilization:.1%} of the limit over "
        f"{end - start:.1f} s after the first 429 + {SETTLED_AFTER_S:g} s, {limited} 429s of {len(settled)}"
    )
    assert utilization >= 0.85
    assert share_429 <= 0.03
