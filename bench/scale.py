"""10,000 concurrent sessions at 30 s model latency, one wave, raygen and then the asyncio runner with the
same 10,000 at once on their own simulator: every session starts as soon as raygen can
start it and makes two model calls (terminal-only prompts; the ``fake`` environment, so the environment
costs nothing and the model path is what is measured).

- throughput = sessions / (last end - first start); ideal = sessions / (2 x latency), i.e. every session
  running at once from the first moment; the ratio is the headline. The ramp (first to last session
  start, mostly actors starting) and the median session time are reported so a miss can be attributed.
- peak memory = the highest sum of RSS over all raygen processes (driver, Ray's processes, actors),
  sampled every 0.5 s; the simulator is reported separately.
"""

from __future__ import annotations

import statistics

from bench.common import GIB, Context, Row, Sim, pct, run_baseline, run_raygen, write_prompts
from bench.procs import TreeSampler
from bench.throughput import equal_memory_pool
from raygen.config import SimConfig

CALLS_PER_SESSION = 2
RSS_LIMIT = 6 * GIB


def _sizes(ctx: Context) -> tuple[int, int, int, float]:
    """(sessions, workers, sessions per worker, latency)."""
    # One actor per core: each actor costs Ray's per-process overhead (measured 2x1000 83.7% of ideal
    # at 17 ms CPU a session, 8x250 73.4% at 30 ms on these 2 cores).
    return (1000, 2, 500, 5.0) if ctx.quick else (10_000, 2, 5000, 30.0)


def run(ctx: Context) -> list[Row]:
    sessions, workers, per_worker, latency = _sizes(ctx)
    work = ctx.dir("scale")
    dataset = write_prompts(work / "prompts.jsonl", sessions, toolsets=["terminal"], tag="scale")
    config = {
        "env": {"type": "fake"},
        "ray": {"workers": workers, "sessions_per_worker": per_worker},
        "model": {"timeout_s": latency * 4},
    }
    with Sim(SimConfig(latency_s=latency)) as sim, TreeSampler(sim.proc.pid) as sim_sampler:
        got = run_raygen(
            ctx, "scale", dataset, config, base_url=sim.url, timeout_s=latency * 8 + 600, pss=True
        )
        sim_stats = sim.stats()
    with Sim(SimConfig(latency_s=latency)) as sim:  # the pool's own simulator: sim_peak_rss is raygen's only
        pool = _pool_wave(ctx, sim.url, got.measured.sampler.peak_rss, latency)
    with Sim(SimConfig(latency_s=latency)) as sim:
        _, base = run_baseline(
            ctx,
            "scale-asyncio",
            "asyncio",
            dataset,
            concurrency=sessions,
            base_url=sim.url,
            timeout_s=latency * 8 + 600,
        )
    times, sampler = got.times, got.measured.sampler
    session_s = CALLS_PER_SESSION * latency
    ideal = sessions / session_s
    ratio = times.rate / ideal
    ramp = max(times.starts) - times.first_start
    durations = [e - s for s, e in zip(times.starts, times.ends, strict=True)]
    median = statistics.median(durations)
    window_cpu = sampler.cpu_between(times.first_start, times.last_end)
    ctx.results["scale"] = {
        "sessions": times.count,
        "failed": times.failed,
        "rate": times.rate,
        "ideal": ideal,
        "ramp_s": ramp,
        "median_session_s": median,
        "peak_rss": sampler.peak_rss,
        "peak_pss": sampler.peak_pss,
        "sim_peak_rss": sim_sampler.peak_rss,
        "sim_max_in_flight": sim_stats.get("max_in_flight"),
        "cpu_window_s": window_cpu,
        "peak_breakdown": sampler.peak_breakdown,
    }
    ctx.results["scale"]["pool"] = pool
    pool_ratio = times.rate / pool["rate"] if pool["rate"] > 0 else float("inf")
    base_ratio = times.rate / base.rate if base.rate > 0 else float("inf")
    ctx.results["scale"]["asyncio"] = {"rate": base.rate, "sessions": base.count, "failed": base.failed}
    scenario = f"{sessions} sessions at {latency:.0f} s latency ({workers}x{per_worker})"
    return [
        Row(
            scenario,
            "throughput vs ideal",
            pct(ratio),
            ">= 90.0%",
            ratio >= 0.9,
            f"{times.rate:.1f}/s vs {ideal:.1f}/s; {times.count} sessions ({times.failed} failed); "
            f"starts spread over {ramp:.1f} s; median session {median:.1f} s (ideal {session_s:.0f}); "
            f"simulator saw {sim_stats.get('max_in_flight')} requests at once",
        ),
        Row(
            scenario,
            "raygen / asyncio runner",
            f"{base_ratio:.2f}x",
            ">= 1.00x",
            base_ratio >= 1.0,
            f"asyncio runner, all {base.count} at once on one loop ({base.failed} failed): {base.rate:.1f}/s",
        ),
        Row(
            scenario,
            "peak RSS, all raygen processes",
            f"{sampler.peak_rss / GIB:.2f} GiB",
            "<= 6.00 GiB",
            sampler.peak_rss <= RSS_LIMIT,
            f"PSS {sampler.peak_pss / GIB:.2f} GiB; largest (GiB): {sampler.describe_peak(4)}"
            f"; simulator {sim_sampler.peak_rss / GIB:.2f} GiB; "
            f"CPU {window_cpu / times.count * 1000:.0f} ms/session",
        ),
        Row(
            scenario,
            "raygen / process pool, equal RSS",
            f"{pool_ratio:.1f}x",
            ">= 5.00x",
            pool_ratio >= 5.0,
            f"pool of {pool['processes']} processes (what fits in raygen's peak RSS), one wave of "
            f"{pool['sessions']} sessions at the same latency: {pool['rate']:.2f} sessions/s",
        ),
    ]


def _pool_wave(ctx: Context, base_url: str, raygen_rss: int, latency: float) -> dict:
    """The process-pool runner with as many processes as fit in raygen's peak RSS, one session each."""
    with Sim(SimConfig(latency_s=0.05)) as fast:  # calibration at 30 s latency would take minutes
        size = equal_memory_pool(ctx, fast.url, raygen_rss)
    dataset = write_prompts(ctx.dir("scale") / "pool.jsonl", size, toolsets=["terminal"], tag="scale-pool")
    _, times = run_baseline(
        ctx, "scale-pool", "pool", dataset, concurrency=size, base_url=base_url, timeout_s=latency * 8 + 300
    )
    return {"processes": size, "sessions": times.count, "failed": times.failed, "rate": times.rate}
