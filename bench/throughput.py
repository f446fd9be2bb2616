"""Throughput and CPU per session at 200 ms model latency: raygen vs the two baselines (bench.baselines).

Every runner does the same work against the same simulator: terminal-only prompts, so a session is two
model calls and one real ``bash -c`` command in a fresh working directory (raygen: the ``local``
environment). Figures per runner:
- sessions/s from the first session's start to the last one's end (start-up and merge excluded);
- CPU per session over that window, of the runner's whole process tree (raygen: driver, Ray's gcs,
  raylet, agents and workers; the commands), and also over the whole invocation including start-up;
- CPU per session over the same window counted for the whole machine (issue 24): every process that
  carries the run's environment mark or descends from one, wherever it sits (Ray's daemons and workers
  included, re-parented ones too), the simulator excluded; beside it the machine's busy CPU from
  /proc/stat, which on a shared machine includes everyone else's work;
- peak RSS of that tree (and PSS, which counts shared pages once).
raygen and the asyncio runner run the same number of sessions at once; the pool gets as many processes
as fit in raygen's peak RSS ("equal memory"), measured with a small calibration pool first. In a full run
the three are measured twice, in opposite orders, and the ratios use the mean of the two rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.common import (
    GIB,
    MIB,
    Context,
    Measured,
    Row,
    SessionTimes,
    Sim,
    run_baseline,
    run_raygen,
    write_prompts,
)
from raygen.config import SimConfig

LATENCY_S = 0.2
WORKERS, SESSIONS_PER_WORKER = 2, 32
CONCURRENCY = WORKERS * SESSIONS_PER_WORKER


@dataclass
class Figures:
    label: str
    rate: float
    cpu_ms: float
    """CPU per session over the sessions' window."""
    cpu_total_ms: float
    """CPU per session over the whole invocation (start-up, merge)."""
    machine_cpu_ms: float
    """CPU per session over the sessions' window, every marked process of the machine (bench.procs)."""
    busy_ms: float
    """The machine's busy CPU per session over that window (/proc/stat: every process, others' too)."""
    rss: int
    pss: int
    sessions: int
    failed: int
    peak: str = ""
    """The largest process kinds at peak RSS."""

    @classmethod
    def of(cls, label: str, measured: Measured, times: SessionTimes) -> Figures:
        s, m = measured.sampler, measured.machine
        n = max(1, times.count)
        window = (times.first_start, times.last_end)
        return cls(
            label=label,
            rate=times.rate,
            cpu_ms=1000 * s.cpu_between(*window) / n,
            machine_cpu_ms=1000 * m.cpu_between(*window) / n if m else 0.0,
            busy_ms=1000 * m.machine_busy_between(*window) / n if m else 0.0,
            cpu_total_ms=1000 * s.cpu_s / n,
            rss=s.peak_rss,
            pss=s.peak_pss,
            sessions=times.count,
            failed=times.failed,
            peak=s.describe_peak(),
        )

    def note(self) -> str:
        return (
            f"{self.sessions} sessions ({self.failed} failed); CPU {self.cpu_ms:.0f} ms/session "
            f"({self.cpu_total_ms:.0f} incl. start-up; whole machine {self.machine_cpu_ms:.0f}, machine busy "
            f"{self.busy_ms:.0f}); peak RSS {_mem(self.rss)} (PSS {_mem(self.pss)})"
        )


def _mem(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _sizes(ctx: Context) -> tuple[int, int, int]:
    """(sessions for raygen and asyncio, pool sessions per process, rounds)."""
    return (200, 3, 1) if ctx.quick else (1500, 8, 2)


def cpu(ctx: Context) -> list[Row]:
    """raygen and the asyncio runner only, one round of the full size: the CPU ratio both ways of
    counting, in about a minute (no process pool)."""
    return run(ctx, runners=("raygen", "asyncio"), rounds=1)


def run(ctx: Context, runners: tuple[str, ...] = ("raygen", "asyncio", "pool"), rounds: int = 0) -> list[Row]:
    sessions, per_process, full_rounds = _sizes(ctx)
    rounds = rounds or full_rounds
    data = ctx.dir("throughput")
    runs: dict[str, list[Figures]] = {"raygen": [], "asyncio": [], "pool": []}
    pool_size = 0
    with Sim(SimConfig(latency_s=LATENCY_S)) as sim:
        order = list(runners)
        for round_no in range(rounds):
            for runner in order if round_no % 2 == 0 else order[::-1]:
                tag = f"{runner}-{round_no + 1}"
                if runner == "raygen":
                    dataset = write_prompts(data / f"{tag}.jsonl", sessions, toolsets=["terminal"], tag=tag)
                    config = {
                        "env": {"type": "local"},
                        "ray": {"workers": WORKERS, "sessions_per_worker": SESSIONS_PER_WORKER},
                    }
                    got = run_raygen(
                        ctx,
                        f"tp-{tag}",
                        dataset,
                        config,
                        base_url=sim.url,
                        timeout_s=900,
                        pss=True,
                        machine=True,
                    )
                    runs["raygen"].append(
                        Figures.of(f"raygen {WORKERS}x{SESSIONS_PER_WORKER}", got.measured, got.times)
                    )
                else:
                    if runner == "asyncio":
                        count, concurrency, label = sessions, CONCURRENCY, f"asyncio, {CONCURRENCY} at once"
                    else:
                        if not pool_size:
                            pool_size = equal_memory_pool(ctx, sim.url, max(f.rss for f in runs["raygen"]))
                        count, concurrency = max(60, pool_size * per_process), pool_size
                        label = f"process pool, {pool_size} processes"
                    dataset = write_prompts(data / f"{tag}.jsonl", count, toolsets=["terminal"], tag=tag)
                    m, t = run_baseline(
                        ctx,
                        f"tp-{tag}",
                        runner,
                        dataset,
                        concurrency=concurrency,
                        base_url=sim.url,
                        timeout_s=900,
                        pss=True,
                        machine=True,
                    )
                    runs[runner].append(Figures.of(label, m, t))
                ctx.log(
                    f"throughput {tag}: {runs[runner][-1].rate:.1f} sessions/s; {runs[runner][-1].note()}"
                )
    ctx.results["throughput"] = {k: [f.__dict__ for f in v] for k, v in runs.items()}
    return _rows(runs)


def equal_memory_pool(ctx: Context, base_url: str, raygen_rss: int) -> int:
    """Processes of the pool runner that fit in ``raygen_rss``: measured RSS of a 2-process pool, per
    process (its parent counts as one more); calibrated once per benchmark run."""
    per_process = ctx.results.get("pool_rss_per_process")
    if per_process is None:
        prompts = ctx.dir("pool-calibration") / "prompts.jsonl"
        dataset = write_prompts(prompts, 8, toolsets=["terminal"], tag="cal")
        m, _ = run_baseline(
            ctx, "pool-calibration", "pool", dataset, concurrency=2, base_url=base_url, timeout_s=300
        )
        per_process = ctx.results["pool_rss_per_process"] = m.sampler.peak_rss / 3
    size = max(2, min(256, int(raygen_rss / per_process) - 1))
    ctx.log(
        f"pool calibration: {_mem(int(per_process))} per process -> {size} processes in {_mem(raygen_rss)}"
    )
    return size


def _rows(runs: dict[str, list[Figures]]) -> list[Row]:
    scenario = f"throughput ({LATENCY_S * 1000:.0f} ms latency)"
    rows: list[Row] = []
    mean: dict[str, float] = {}
    for runner, figs in runs.items():
        if not figs:
            continue
        mean[runner] = statistics.mean(f.rate for f in figs)
        spread = "" if len(figs) < 2 else f"rounds {', '.join(f'{f.rate:.1f}' for f in figs)}; "
        rows.append(
            Row(
                scenario, f"{figs[0].label}: sessions/s", f"{mean[runner]:.1f}", note=spread + figs[-1].note()
            )
        )
    if "raygen" in mean and "asyncio" in mean:
        r = mean["raygen"] / mean["asyncio"]
        rows.append(
            Row(scenario, "raygen / asyncio runner", f"{r:.2f}x", ">= 0.95x", r >= 0.95, "sessions/s")
        )
        cpu = statistics.mean(f.cpu_ms for f in runs["raygen"]) / statistics.mean(
            f.cpu_ms for f in runs["asyncio"]
        )
        rows.append(
            Row(
                scenario,
                "raygen / asyncio runner, CPU per session",
                f"{cpu:.2f}x",
                "<= 2.00x",
                cpu <= 2.0,
                "machine CPU of each runner's process tree (raygen: Ray's too), sessions' window",
            )
        )
        whole = statistics.mean(f.machine_cpu_ms for f in runs["raygen"]) / statistics.mean(
            f.machine_cpu_ms for f in runs["asyncio"]
        )
        rows.append(
            Row(
                scenario,
                "raygen / asyncio runner, CPU per session, whole machine",
                f"{whole:.2f}x",
                "<= 2.00x",
                whole <= 2.0,
                "every process of each run found by its environment mark, wherever it sits (issue 24)",
            )
        )
    if "raygen" in mean and "pool" in mean:
        r = mean["raygen"] / mean["pool"]
        rows.append(
            Row(scenario, "raygen / process pool", f"{r:.2f}x", ">= 5.00x", r >= 5.0, "sessions/s, equal RSS")
        )
    return rows
