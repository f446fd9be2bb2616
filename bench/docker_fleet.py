"""Sandboxes at fleet scale (issue 21), side by side in one run: raygen's Docker sessions/s against the
thinnest Docker runner (``bench.docker_thin``) at 16 and 64 sessions in flight, on the same simulator
(50 ms a call) and the same terminal-only prompts; raygen's median exec through the exec channel and
through one ``docker exec`` per call; and the median wait for a sandbox with a warm pool.

Sessions/s is counted from the first session's start to the last one's end (start-up excluded) for
both. Targets (issue 21): raygen at least 1.5x the thin runner at 16 and at 64, median exec at most
10 ms. The machine's load is printed with the figures: on a shared machine they are noisy.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from bench.common import Context, Row, Sim, run_measured, run_raygen, tail, write_prompts
from bench.sandboxes import IMAGE, _docker_problem
from raygen.config import DockerEnvConfig, SimConfig
from raygen.envs import EnvSpec, create_environment
from raygen.envs.docker_pool import pool_for

WARM_POOL = 4


async def _exec_medians(repeats: int) -> dict[str, float]:
    """Median ``echo ok`` through the channel and through docker exec, one container each."""
    out: dict[str, float] = {}
    for label, channel in (("channel", True), ("docker exec", False)):
        config = DockerEnvConfig(default_image=IMAGE, pull="never", exec_channel=channel)
        spec = EnvSpec(session_key=f"exec-{uuid.uuid4().hex[:6]}", run_name="bench-fleet")
        async with create_environment(config, spec) as env:
            await env.exec("true", 30, 100)
            took = []
            for _ in range(repeats):
                began = time.perf_counter()
                await env.exec("echo ok", 30, 100)
                took.append(time.perf_counter() - began)
        out[label] = statistics.median(took)
    return out


def _thin(ctx: Context, name: str, dataset: Path, concurrency: int, base_url: str) -> dict:
    work = ctx.dir(name)
    out = work / "sessions.json"
    cmd = [sys.executable, "-m", "bench.docker_thin", "--base-url", base_url, "--dataset", str(dataset)]
    cmd += ["--concurrency", str(concurrency), "--image", IMAGE, "--out", str(out)]
    measured = run_measured(cmd, work / "thin.log", timeout_s=600)
    if measured.returncode != 0 or not out.exists():
        raise RuntimeError(f"thin runner exited {measured.returncode}:\n{tail(measured.log_path)}")
    return json.loads(out.read_text())


def _rate(starts: list[float], ends: list[float]) -> float:
    span = max(ends) - min(starts)
    return len(ends) / span if span > 0 else 0.0


def _env_setup(run_dir: Path) -> list[float]:
    waits = []
    for shard in sorted((run_dir / "shards").glob("*.jsonl")):
        for line in shard.read_text().splitlines():
            if line.strip():
                waits.append((json.loads(line).get("timing") or {}).get("env_setup_s") or 0.0)
    return waits


BEFORE = {"exec_channel": False, "warm_pool": 0, "fleet": {}}
"""raygen as it was before issue 21: one docker exec per call, no pool, no sandbox governor."""


def _raygen(ctx: Context, sim: Sim, name: str, dataset: Path, concurrency: int, env: dict) -> dict:
    workers = 2
    config = {
        "env": {"type": "docker", "default_image": IMAGE, "pull": "never", **env},
        "ray": {"workers": workers, "sessions_per_worker": concurrency // workers},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    got = run_raygen(ctx, name, dataset, config, base_url=sim.url, timeout_s=600)
    waits = _env_setup(got.run_dir)
    return {"rate": got.times.rate, "failed": got.times.failed, "wait_s": statistics.median(waits)}


def _pair(ctx: Context, sim: Sim, concurrency: int, sessions: int, before: bool) -> list[Row]:
    name = f"fleet-{concurrency}"
    dataset = write_prompts(ctx.dir(name) / "prompts.jsonl", sessions, toolsets=["terminal"], tag=name)
    thin = _thin(ctx, f"{name}-thin", dataset, concurrency, sim.url)
    thin_rate = _rate(thin["starts"], thin["ends"])
    after = _raygen(ctx, sim, f"{name}-raygen", dataset, concurrency, {"warm_pool": WARM_POOL})
    old = _raygen(ctx, sim, f"{name}-before", dataset, concurrency, BEFORE) if before else None
    figures = ctx.results[name] = {
        "thin_rate": thin_rate,
        "thin_failed": thin["failed"],
        "thin_container_start_median_s": statistics.median(thin["waits"]),
        "thin_exec_median_s": statistics.median(thin["execs"]),
        "raygen": after,
        "raygen_before": old,
    }
    ratio = after["rate"] / thin_rate if thin_rate else 0.0
    was = f"; before issue 21: {old['rate']:.2f}/s ({old['rate'] / thin_rate:.2f}x)" if old else ""
    return [
        Row(
            "docker fleet",
            f"{concurrency} in flight: raygen vs thin sessions/s",
            f"{after['rate']:.2f} vs {thin_rate:.2f} ({ratio:.2f}x)",
            target=">= 1.5x",
            met=ratio >= 1.5,
            note=f"{sessions} sessions each; failed {after['failed']} / {thin['failed']}{was}",
        ),
        Row(
            "docker fleet",
            f"{concurrency} in flight: median sandbox wait, raygen (warm_pool {WARM_POOL}) vs thin",
            f"{after['wait_s']:.2f} s vs {figures['thin_container_start_median_s']:.2f} s",
            note=f"thin runner's median docker exec {1000 * figures['thin_exec_median_s']:.0f} ms"
            + (f"; raygen before: {old['wait_s']:.2f} s" if old else ""),
        ),
    ]


async def _pool_handover(takes: int) -> float:
    """Median time a session waits for its sandbox when the warm pool has one ready (idle machine)."""
    config = DockerEnvConfig(default_image=IMAGE, pull="never", warm_pool=2)
    run_name = f"bench-pool-{uuid.uuid4().hex[:6]}"
    pool = pool_for(config, run_name)
    took = []
    for index in range(takes + 1):
        deadline = time.monotonic() + 60
        while index and not pool.ready.get(IMAGE) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        env = create_environment(config, EnvSpec(session_key=f"take-{index}", run_name=run_name))
        began = time.perf_counter()
        await env.start()
        if index:  # the first one made the demand: the pool was empty
            took.append(time.perf_counter() - began)
        await env.close()
    await pool.drain()
    return statistics.median(took)


def run(ctx: Context) -> list[Row]:
    problem = _docker_problem()
    if problem is not None:
        return [Row("docker fleet", "skipped", "-", note=problem)]
    medians = asyncio.run(_exec_medians(10 if ctx.quick else 30))
    handover = asyncio.run(_pool_handover(5 if ctx.quick else 15))
    ctx.results["fleet-exec"] = {**medians, "pool_handover_s": handover}
    rows = [
        Row(
            "docker fleet",
            "median exec: channel vs docker exec (one container, idle)",
            f"{1000 * medians['channel']:.1f} vs {1000 * medians['docker exec']:.1f} ms",
            target="<= 10 ms",
            met=medians["channel"] <= 0.010,
        ),
        Row(
            "docker fleet",
            "median sandbox wait with a ready warm-pool container (idle)",
            f"{1000 * handover:.1f} ms",
            note="a container start is 0.35 s idle, seconds under load",
        ),
    ]
    with Sim(SimConfig()) as sim:
        # --quick: the "before" run at 16 only
        for concurrency, sessions in ((16, 32), (64, 64)):
            rows += _pair(ctx, sim, concurrency, sessions, before=concurrency == 16 or not ctx.quick)
    return rows
