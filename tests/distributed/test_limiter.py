"""RateLimiter arithmetic with a fake clock: pacing, tokens, in-flight cap, AIMD, pauses, convergence."""

from __future__ import annotations

import heapq
import itertools
import math
import random

import pytest

from raygen.config import GovernorConfig
from raygen.distributed.leases import UsageReport
from raygen.distributed.limiter import RateLimiter


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(clock: FakeClock | None = None, **config) -> tuple[RateLimiter, FakeClock]:
    clock = clock or FakeClock()
    config.setdefault("adaptive", config.get("rpm") is None)  # the AIMD tests probe for an unknown limit
    config.setdefault("headroom", 1.0)  # exact arithmetic; the default headroom has a test of its own
    return RateLimiter(GovernorConfig(**config), clock), clock


def limited(epoch: int, pause_s: float = 0.0) -> UsageReport:
    return UsageReport(completed=1, rate_limited=1, rate_limited_epoch=epoch, pause_s=pause_s)


# ------------------------------------------------------------------ pacing


def test_known_rpm_paces_a_greedy_client_over_a_minute():
    lim, clock = make(rpm=600, burst_s=1.0)
    grants: list[tuple[float, int]] = []
    start = clock.t
    while clock.t < start + 60:
        got = lim.lease("w", want_requests=1000).requests  # asks for far more than a minute's worth
        if got:
            grants.append((clock.t - start, got))
            lim.report("w", UsageReport(completed=got))
        clock.t += 0.01
    total = sum(n for _, n in grants)
    print(f"\nknown rpm 600, greedy client, 60 s: {total} granted")
    # 600 per minute plus the one initial burst (10), within rounding.
    assert 600 <= total <= 600 + 10 + 1
    assert max(n for _, n in grants) <= 10  # never more than burst_s worth at once
    # Any window of w seconds holds at most burst + rate * w.
    times = [t for t, n in grants for _ in range(n)]
    for i, t0 in enumerate(times):
        j = i
        while j < len(times) and times[j] <= t0 + 2.0:
            j += 1
        assert j - i <= 10 + 10 * 2.0 + 1


def test_known_limits_are_paced_with_the_default_headroom():
    limiter, clock = make(rpm=600, tpm=60_000, headroom=GovernorConfig().headroom)
    assert GovernorConfig().headroom == 0.97
    assert limiter.target_rpm == pytest.approx(582) and limiter.target_tpm == pytest.approx(58_200)
    total, start = 0, clock.t
    while clock.t < start + 60:
        got = limiter.lease("w", want_requests=1000).requests
        if got:
            total += got
            limiter.report("w", UsageReport(completed=got))
        clock.t += 0.01
    assert 582 <= total <= 582 + 10  # 97% of a minute's worth plus the initial burst (1 s of 582 rpm)


def test_smaller_burst_window_means_smaller_bursts():
    lim, _ = make(rpm=600, burst_s=0.2)
    assert lim.lease("w", 1000).requests == 2


def test_min_requests_holds_back_until_a_batch_is_available():
    lim, clock = make(rpm=600)
    assert lim.lease("w", 10).requests == 10
    clock.t += 0.35  # 3.5 slots refilled
    assert lim.lease("w", 5, min_requests=5).requests == 0
    assert lim.wait_hint(5) == pytest.approx(0.15)
    clock.t += 0.15
    assert lim.lease("w", 5, min_requests=5).requests == 5


# ------------------------------------------------------------------ tokens


def test_usage_reconciliation_charges_the_debt_or_refunds():
    lim, clock = make(tpm=6000, adaptive=False, burst_s=1.0)  # 100 tokens/s, bucket of 100
    assert lim.lease("w", 2, want_tokens=100).requests == 2
    # Both calls really used 150 tokens instead of the estimated 50: 200 tokens of debt.
    lim.report("w", UsageReport(completed=2, token_adjust=200, tokens_used=300))
    assert lim.lease("w", 1, want_tokens=50).requests == 0
    assert lim.wait_hint(1, 50) == pytest.approx(2.5)
    clock.t += 2.5
    assert lim.lease("w", 1, want_tokens=50).requests == 1

    lim2, _ = make(tpm=6000, adaptive=False, burst_s=1.0)
    assert lim2.lease("w", 2, want_tokens=100).requests == 2
    lim2.report("w", UsageReport(completed=2, token_adjust=-80, tokens_used=20))  # used far less
    assert lim2.lease("w", 1, want_tokens=50).requests == 1


def test_actual_tokens_hold_tpm_even_when_estimates_are_three_times_too_low():
    lim, clock = make(tpm=60_000, adaptive=False, burst_s=1.0)  # 1000 tokens/s
    start, actual = clock.t, 0
    while clock.t < start + 60:
        got = lim.lease("w", 10, want_tokens=10 * 100).requests  # estimates 100 per call ...
        if got:
            actual += got * 300  # ... uses 300
            lim.report("w", UsageReport(completed=got, token_adjust=got * 200, tokens_used=got * 300))
        clock.t += 0.05
    print(f"\ntpm 60000 with 3x under-estimates, 60 s: {actual} actual tokens")
    assert 0.9 * 60_000 <= actual <= 60_000 + 1000 + 10 * 300


def test_a_request_larger_than_the_token_bucket_still_goes_when_the_bucket_is_full():
    lim, clock = make(tpm=600, adaptive=False, burst_s=1.0)  # bucket of 10 tokens
    assert lim.lease("w", 1, want_tokens=500).requests == 1
    assert lim.lease("w", 1, want_tokens=500).requests == 0
    clock.t += 60
    assert lim.lease("w", 1, want_tokens=500).requests == 1


# ------------------------------------------------------------------ in flight


def test_in_flight_cap_across_workers():
    lim, _ = make(max_in_flight=3, adaptive=False)
    assert lim.lease("a", 2).requests == 2
    assert lim.lease("b", 5).requests == 1
    assert lim.lease("b", 1).requests == 0
    lim.report("a", UsageReport(completed=1))
    assert lim.lease("b", 5).requests == 1
    lim.report("b", UsageReport(returned=2))
    assert lim.lease("a", 5).requests == 2


def test_a_silent_worker_is_presumed_dead_and_its_slots_freed():
    lim, clock = make(max_in_flight=2, adaptive=False)
    assert lim.lease("dead", 2).requests == 2
    clock.t += 30
    assert lim.lease("alive", 1).requests == 0
    clock.t += 31
    assert lim.lease("alive", 1).requests == 1


# ------------------------------------------------------------------ AIMD and pauses


def test_a_burst_of_429s_cuts_the_target_once():
    lim, clock = make(initial_rpm=600)
    assert lim.adaptive and lim.target_rpm == 600
    lease = lim.lease("a", 5)
    lim.report("a", limited(lease.epoch))
    assert lim.target_rpm == pytest.approx(420)
    for _ in range(20):  # more answers for requests sent before the cut, from several workers
        lim.report("b", limited(lease.epoch))
    fresh = lim.lease("b", 1)
    clock.t += 0.5
    lim.report("b", limited(fresh.epoch))  # admitted after the cut, but within the cut window
    assert lim.target_rpm == pytest.approx(420)
    clock.t += 1.0
    lim.report("b", limited(lease.epoch))  # past the window, yet admitted before the cut: no new cut
    assert lim.target_rpm == pytest.approx(420)
    lim.report("b", limited(fresh.epoch))
    assert lim.target_rpm == pytest.approx(420 * 0.7)
    assert lim.snapshot()["cuts"] == 2
    assert lim.snapshot()["rate_limited"] == 24


def test_retry_after_pauses_every_worker_until_it_passes():
    lim, clock = make(initial_rpm=600)
    lim.lease("a", 1)
    lim.report("a", limited(0, pause_s=5.0))
    clock.t += 4.9
    paused = lim.lease("b", 1)
    assert paused.requests == 0 and paused.pause_s == pytest.approx(0.1)
    assert lim.snapshot()["paused_for_s"] == pytest.approx(0.1)
    clock.t += 0.1
    assert lim.lease("b", 1).requests == 1


def test_known_rpm_is_not_cut_but_honours_retry_after():
    lim, clock = make(rpm=600)
    assert not lim.adaptive
    lim.lease("a", 5)
    lim.report("a", limited(0))
    assert lim.target_rpm == 600 and lim.lease("a", 1).requests == 1
    lim.report("a", limited(0, pause_s=2.0))
    assert lim.target_rpm == 600 and lim.lease("a", 1).requests == 0
    clock.t += 2.0
    assert lim.lease("a", 1).requests == 1


def test_pause_is_capped_by_max_pause_s():
    lim, _ = make(rpm=600, max_pause_s=10)
    lim.report("a", UsageReport(pause_s=3600))
    assert lim.lease("a", 1).pause_s == pytest.approx(10)


def test_server_errors_and_timeouts_do_not_cut():
    lim, clock = make(initial_rpm=600)
    lim.lease("a", 5)
    for _ in range(10):
        lim.report("a", UsageReport(completed=1, errors=1))
        clock.t += 0.5
    assert lim.target_rpm == 600
    assert lim.snapshot()["errors"] == 10


def drive_busy(lim: RateLimiter, clock: FakeClock, seconds: float, dt: float = 0.05) -> list[float]:
    """A demand-unlimited worker for ``seconds``; returns the target after each step."""
    targets = []
    end = clock.t + seconds
    while clock.t < end:
        got = lim.lease("w", 100).requests
        if got:
            lim.report("w", UsageReport(completed=got))
        targets.append(lim.target_rpm)
        clock.t += dt
    return targets


def test_recovery_after_a_cut_is_gradual_and_bounded_by_the_ceiling():
    lim, clock = make(initial_rpm=600, max_rpm=900)
    lim.lease("w", 1)
    lim.report("w", limited(0))
    assert lim.target_rpm == pytest.approx(420)
    targets = drive_busy(lim, clock, 120)
    changes = [(a, b) for a, b in itertools.pairwise(targets) if b != a]
    assert changes, "the target never grew"
    assert all(b > a for a, b in changes)
    assert max(b / a for a, b in changes) <= 1 + 4 * 0.05 + 1e-9  # no jumps, at most the fast-probe step
    first_grow = next(i for i, t in enumerate(targets) if t > 420) * 0.05
    assert first_grow >= 2.0  # nothing before a full increase interval of clean traffic
    # Near the rate that drew the 429 it only creeps (5 % steps); well past it without a 429 the old
    # limit is forgotten and probing speeds up again; the ceiling bounds it.
    near = [b / a for a, b in changes if 0.9 * 600 <= a < 1.1 * 600]
    assert len(near) >= 2 and max(near) <= 1.05 + 1e-9
    assert max(b / a for a, b in changes if a >= 1.1 * 600) > 1.05
    assert max(targets) == pytest.approx(900)


def test_an_idle_cluster_does_not_grow_its_target():
    lim, clock = make(initial_rpm=600)
    for _ in range(600):  # one request a second: far below the target
        lim.lease("w", 1)
        lim.report("w", UsageReport(completed=1))
        clock.t += 1.0
    assert lim.target_rpm == 600


def test_unknown_limit_probes_upward_from_initial_rpm():
    lim, clock = make(initial_rpm=60, max_rpm=5000)
    targets = drive_busy(lim, clock, 120)
    assert targets[0] == 60 and targets[-1] > 1000


# ------------------------------------------------------------------ provider simulation


def simulate(config: GovernorConfig, limit_rpm: float, *, duration_s=300.0, warmup_s=60.0, seed=7) -> dict:
    """Discrete-time model of a provider enforcing ``limit_rpm`` as a 1-second token bucket (429 with a
    whole-second Retry-After when empty), 4 workers whose sessions (enough to want 3x the limit) have
    unlimited demand and share one
    limiter through leases (at most lease_size, used at once), 0-50 ms of network jitter, 0.5-1.5 s
    model latency, 50 ms for a 429. Utilization counts successes after ``warmup_s`` against the limit."""
    rng = random.Random(seed)
    clock = FakeClock(0.0)
    lim = RateLimiter(config, clock)
    rate = limit_rpm / 60.0
    capacity = max(1.0, rate)
    level = capacity
    workers, dt = 4, 0.02
    sessions = max(10, math.ceil(rate * 3 / workers))
    waiting: list[list[float]] = [[] for _ in range(workers)]
    slots: list[list[list]] = [[] for _ in range(workers)]  # [count, epoch, expires_at]
    pending = [UsageReport() for _ in range(workers)]
    next_lease = [0.0] * workers
    events = [(rng.random(), w, "ready", 0, 0.0) for w in range(workers) for _ in range(sessions)]
    heapq.heapify(events)
    counts = {"ok": 0, "429": 0, "sent": 0}
    target_at_warmup = None
    for step in range(int(duration_s / dt)):
        now = clock.t = step * dt
        counting = now >= warmup_s
        if counting and target_at_warmup is None:
            target_at_warmup = lim.target_rpm
        level = min(capacity, level + rate * dt)
        while events and events[0][0] <= now:
            _, w, kind, epoch, retry_after = heapq.heappop(events)
            if kind == "arrive":  # the provider decides
                if level >= 1 - 1e-9:
                    level -= 1
                    counts["ok"] += counting
                    heapq.heappush(events, (now + rng.uniform(0.5, 1.5), w, "done", epoch, 0.0))
                else:
                    counts["429"] += counting
                    retry = max(1.0, math.ceil((1 - level) / rate))
                    heapq.heappush(events, (now + 0.05, w, "limited", epoch, retry))
            elif kind == "done":
                pending[w].completed += 1
                waiting[w].append(now)
            elif kind == "limited":  # reported at once; the session retries after Retry-After
                lim.report(f"w{w}", limited(epoch, pause_s=retry_after))
                heapq.heappush(events, (now + retry_after, w, "ready", 0, 0.0))
            else:
                waiting[w].append(now)
        for w in range(workers):
            for slot in slots[w]:
                if slot[2] <= now:
                    pending[w].returned += slot[0]
                    slot[0] = 0
            slots[w] = [s for s in slots[w] if s[0] > 0]
            have = sum(s[0] for s in slots[w])
            if len(waiting[w]) > have and now >= next_lease[w]:
                want = min(config.lease_size, len(waiting[w]) - have)
                lim.report(f"w{w}", pending[w])
                pending[w] = UsageReport()
                lingering = now - waiting[w][0] < config.burst_s / 2
                lease = lim.lease(f"w{w}", want, min_requests=want if lingering else 1)
                if lease.requests:
                    slots[w].append([lease.requests, lease.epoch, now + lease.ttl_s])
                else:
                    next_lease[w] = now + max(lease.wait_hint_s, lease.pause_s, dt)
            while waiting[w] and slots[w]:
                slot = slots[w][0]
                waiting[w].pop(0)
                slot[0] -= 1
                if slot[0] == 0:
                    slots[w].pop(0)
                counts["sent"] += counting
                heapq.heappush(events, (now + rng.uniform(0, 0.05), w, "arrive", slot[1], 0.0))
    return {
        "utilization": counts["ok"] / (rate * (duration_s - warmup_s)),
        "share_429": counts["429"] / max(1, counts["sent"]),
        "cuts": lim.snapshot()["cuts"],
        "target_at_warmup": target_at_warmup,
        "final_target": lim.target_rpm,
    }


@pytest.mark.parametrize("limit_rpm", [60, 120, 600, 3000])
def test_adaptive_converges_near_a_hidden_limit(limit_rpm):
    result = simulate(GovernorConfig(initial_rpm=60, adaptive=True), limit_rpm)
    print(f"\nadaptive, hidden limit {limit_rpm} rpm, start 60: {_fmt(result)}")
    assert result["utilization"] >= 0.85
    assert result["share_429"] <= 0.05


@pytest.mark.parametrize("limit_rpm", [120, 600, 3000])
def test_known_limit_is_used_fully_without_429s(limit_rpm):
    result = simulate(GovernorConfig(rpm=limit_rpm), limit_rpm)
    print(f"\nknown limit {limit_rpm} rpm: {_fmt(result)}")
    assert result["utilization"] >= 0.95
    assert result["share_429"] <= 0.01


def test_without_a_governor_the_same_provider_answers_mostly_429():
    """Control for the simulation: pacing far above the limit (rpm 10x the real one) must look bad,
    or the figures above would prove nothing."""
    result = simulate(GovernorConfig(rpm=6000), 600)
    print(f"\nrpm set 10x too high on a 600 rpm provider: {_fmt(result)}")
    assert result["share_429"] > 0.2


def _fmt(result: dict) -> str:
    return ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())


# ------------------------------------------------------------------ figures and headers


def test_snapshot_and_bounded_history():
    lim, clock = make(rpm=600)
    for _ in range(2000):
        lim.lease("w", 1)
        lim.report("w", UsageReport(completed=1, in_flight=1, wait_s=0.5))
        clock.t += 1.0
    snap = lim.snapshot()
    assert snap["achieved_rpm"] == pytest.approx(60, rel=0.15)
    assert snap["in_flight"] == 1 and snap["total_wait_s"] == pytest.approx(1000)
    history = lim.history()
    assert 100 <= len(history) <= 600  # capped, yet spans the whole run
    assert history[0]["t"] < 5 and history[-1]["t"] > 1900
    assert all(h["target_rpm"] == 600 for h in history)
