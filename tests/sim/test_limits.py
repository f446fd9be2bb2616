"""The simulator's rate counters with a fake clock: token bucket, fixed window, sliding window, and
requests and tokens checked together; then each kind enforced over HTTP."""

from __future__ import annotations

import openai
import pytest

from raygen.config import SimConfig
from raygen.sim.limits import FixedWindow, RateLimits, SlidingWindow, TokenBucket
from raygen.sim.server import SimServer


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def admit(counter, amount: float = 1.0) -> float:
    wait = counter.wait_for(amount)
    if wait == 0:
        counter.take(amount)
    return wait


def test_token_bucket_refills_at_the_configured_rate():
    clock = Clock()
    bucket = TokenBucket(120, clock=clock)  # 2 per second, burst defaults to 2
    assert admit(bucket) == 0.0 and admit(bucket) == 0.0
    assert admit(bucket) == pytest.approx(0.5)
    clock.now += 0.5
    assert admit(bucket) == 0.0
    clock.now += 100  # never more than the burst is stored
    assert [admit(bucket) for _ in range(3)][:2] == [0.0, 0.0]
    assert bucket.wait_for() > 0
    assert TokenBucket(6).capacity == 1.0  # under one per second the burst is at least 1


def test_token_bucket_lets_an_oversized_amount_through_when_full():
    clock = Clock()
    bucket = TokenBucket(600, clock=clock)  # 10 a second, holds 10
    assert admit(bucket, 25) == 0.0  # more than the bucket: passes when full, leaves a debt
    assert admit(bucket, 1) == pytest.approx(1.6)  # -15 + 1 needed: 16 at 10/s


def test_fixed_window_resets_at_the_clock_boundary_and_allows_two_bursts_across_it():
    clock = Clock(59.0)
    window = FixedWindow(600, 60, clock)  # 600 per 60-s window [0, 60), [60, 120) ...
    assert all(admit(window) == 0 for _ in range(600))
    assert admit(window) == pytest.approx(1.0)  # the window ends at 60
    assert window.reset_s() == pytest.approx(1.0)
    clock.now = 60.0
    assert all(admit(window) == 0 for _ in range(600))  # 1,200 within one second: fixed windows allow it
    assert admit(window) == pytest.approx(60.0)


def test_sliding_window_holds_any_interval_and_frees_by_age():
    clock = Clock(0.0)
    window = SlidingWindow(120, 10, clock)  # 20 in any 10 s
    for i in range(20):
        clock.now = i * 0.25  # 20 requests over 0..4.75 s
        assert admit(window) == 0
    clock.now = 5.0
    assert admit(window) == pytest.approx(5.0)  # the oldest (t=0) leaves at t=10
    assert admit(window, 3) == pytest.approx(5.5)  # three need t=0, 0.25, 0.5 gone
    clock.now = 10.0
    assert admit(window) == 0  # t=0 left; the rest still count
    assert admit(window) == pytest.approx(0.25)
    assert window.remaining() == 0
    clock.now = 20.0
    assert window.remaining() == 20 and window.reset_s() == 0


def test_sliding_window_of_one_second_refuses_a_second_that_fixed_windows_admit():
    # 10 at t=0.6 and 10 at t=1.2: two fixed 1-s windows hold 10 each, the sliding one holds 20 > 10.
    fixed, sliding = Clock(0.6), Clock(0.6)
    fw, sw = FixedWindow(600, 1, fixed), SlidingWindow(600, 1, sliding)
    for counter, clock in ((fw, fixed), (sw, sliding)):
        assert all(admit(counter) == 0 for _ in range(10))
        clock.now = 1.2
    assert all(admit(fw) == 0 for _ in range(10))
    assert admit(sw) == pytest.approx(0.4)


def test_requests_and_tokens_are_checked_together_and_only_admitted_requests_count():
    clock = Clock(0.0)
    cfg = SimConfig(
        rate_limit_rpm=60, rate_limit_tpm=600, rate_limit_kind="sliding_window", rate_limit_window_s=10
    )
    limits = RateLimits(cfg, clock)  # 10 requests and 100 tokens in any 10 s
    assert limits.try_admit(60) == 0
    assert limits.try_admit(60) == pytest.approx(10.0)  # tokens refuse; the request is not counted
    assert limits.requests.remaining() == 9
    assert limits.try_admit(40) == 0
    headers = limits.headers()
    assert headers["x-ratelimit-remaining-requests"] == "8"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-limit-tokens"] == "600"


@pytest.mark.parametrize(
    ("kind", "rpm", "window_s", "retry_after"),
    # The fixed window is an hour (60 requests), so a boundary falls inside the test once in ~10^5 runs.
    [
        ("token_bucket", 60, 60, (1, 1)),
        ("fixed_window", 1, 3600, (1, 3600)),
        ("sliding_window", 60, 10, (9, 10)),
    ],
)
async def test_each_kind_answers_429_over_http(kind, rpm, window_s, retry_after):
    cfg = SimConfig(latency_s=0, rate_limit_rpm=rpm, rate_limit_kind=kind, rate_limit_window_s=window_s)
    async with SimServer(cfg) as sim:
        ai = openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0)
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        allowed = {"token_bucket": 1, "fixed_window": 60, "sliding_window": 10}[kind]
        for _ in range(allowed):
            await ai.chat.completions.create(**body)
        with pytest.raises(openai.RateLimitError) as err:
            await ai.chat.completions.create(**body)
        await ai.close()
        assert retry_after[0] <= int(err.value.response.headers["Retry-After"]) <= retry_after[1]
        assert sim.stats.counts["429"] == 1 and sim.stats.counts["ok"] == allowed


async def test_token_limit_over_http_charges_prompt_and_completion():
    cfg = SimConfig(latency_s=0, rate_limit_tpm=1, rate_limit_kind="fixed_window", rate_limit_window_s=3600)
    async with SimServer(cfg) as sim:
        ai = openai.AsyncOpenAI(base_url=sim.url, api_key="x", max_retries=0)
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 200}]}
        first = await ai.chat.completions.create(**body)  # alone in its window: always admitted
        assert first.usage.total_tokens > 60  # more than the hour's 60 tokens
        with pytest.raises(openai.RateLimitError):
            await ai.chat.completions.create(**body)
        await ai.close()
