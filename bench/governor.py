"""Rate-limit scenarios: the simulator enforces a hard request limit (429 + Retry-After over it) and raygen
runs more sessions than the limit can serve, so the governor, not demand, sets the pace.

Figures, from the simulator's own request log:
- utilization = requests that passed the limit per second / (limit / 60), over the busy window: from the
  first to the last moment at least half the configured sessions were running (demand was surely above
  the limit there); for the adaptive case only from the moment it first reached 90% of the limit (the
  ramp from its starting rate is reported separately);
- 429 share = requests answered 429 / all requests, over the whole run;
- peak = the highest 5-second average of passed requests / limit: on a 2-node cluster a budget applied per
  node would show as about 2x.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from bench.common import Context, Row, Sim, pct, read_request_log, run_raygen, write_prompts
from raygen.config import SimConfig

LIMIT_RPM = 1200.0
"""20 requests/s: well within what this small machine generates, far above what one session does."""
LATENCY_S = 0.2
CALLS_PER_SESSION = 2  # terminal-only prompts: the probe, then the answer


def _duration_s(ctx: Context, adaptive: bool) -> float:
    if ctx.quick:
        return 20.0 if adaptive else 12.0
    return 60.0 if adaptive else 40.0


def _sliding_peak(times: list[float], span: float) -> float:
    """Most events in any window of ``span`` seconds, divided by ``span``."""
    best, lo = 0, 0
    for hi in range(len(times)):
        while times[hi] - times[lo] > span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / span


def _first_reach(times: list[float], rate: float, span: float = 2.0) -> float | None:
    """First time the rate over the trailing ``span`` seconds reached ``rate`` per second."""
    lo = 0
    for hi in range(len(times)):
        while times[hi] - times[lo] > span:
            lo += 1
        if hi - lo + 1 >= rate * span:
            return times[hi]
    return None


def run_case(
    ctx: Context,
    name: str,
    *,
    adaptive: bool,
    ray: dict[str, Any],
    ray_address: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One raygen run against a rate-limited simulator; returns the figures."""
    work = ctx.dir(name)
    concurrency = ray["workers"] * ray["sessions_per_worker"]
    duration = _duration_s(ctx, adaptive)
    sessions = math.ceil(LIMIT_RPM / 60 * duration / CALLS_PER_SESSION)
    dataset = write_prompts(work / "prompts.jsonl", sessions, toolsets=["terminal"], tag=name)
    governor: dict[str, Any] = (
        {"adaptive": True, "initial_rpm": LIMIT_RPM / 4} if adaptive else {"rpm": LIMIT_RPM}
    )
    config: dict[str, Any] = {
        "env": {"type": "fake"},
        "ray": {**ray, **({"address": ray_address} if ray_address else {})},
        "governor": governor,
        # A 429 is retried inside the call; a session only fails if all retries hit the limit.
        "model": {"max_retries": 12},
    }
    log_path = work / "sim-requests.jsonl"
    sim = Sim(SimConfig(latency_s=LATENCY_S, rate_limit_rpm=LIMIT_RPM, log_path=log_path))
    try:
        run = run_raygen(ctx, name, dataset, config, base_url=sim.url, timeout_s=duration * 4 + 300, env=env)
    finally:
        sim.stop()
    requests = read_request_log(log_path)
    passed = sorted(r["ts"] for r in requests if r["status"] != 429)
    limited = sum(r["status"] == 429 for r in requests)
    limit_per_s = LIMIT_RPM / 60
    window = run.times.busy_window(max(1, concurrency // 2))
    if window is None:
        raise RuntimeError(f"{name}: never had {concurrency // 2} sessions running at once")
    ramp_s = None
    if adaptive:
        reached = _first_reach([t for t in passed if t >= window[0]], 0.9 * limit_per_s)
        ramp_s = None if reached is None else reached - window[0]
        whole = window
        window = (reached, window[1]) if reached is not None and reached < window[1] else window
    else:
        whole = window
    span = window[1] - window[0]
    in_window = sum(window[0] <= t <= window[1] for t in passed)
    in_whole = sum(whole[0] <= t <= whole[1] for t in passed)
    return {
        "utilization": in_window / span / limit_per_s,
        "utilization_whole": in_whole / (whole[1] - whole[0]) / limit_per_s,
        "share_429": limited / len(requests) if requests else 0.0,
        "requests": len(requests),
        "limited": limited,
        "window_s": span,
        "ramp_s": ramp_s,
        "peak_5s": _sliding_peak(passed, 5.0) / limit_per_s,
        "sessions": run.times.count,
        "failed": run.times.failed,
        "nodes": dict(Counter(run.times.nodes)),
    }


def _rows(scenario: str, fig: dict[str, Any], util_target: float, share_target: float) -> list[Row]:
    note = (
        f"{fig['window_s']:.0f} s window, {fig['sessions']} sessions ({fig['failed']} failed), "
        f"peak 5 s {pct(fig['peak_5s'])}"
    )
    if fig["ramp_s"] is not None:
        note += f"; ramp {fig['ramp_s']:.0f} s from limit/4, whole window {pct(fig['utilization_whole'])}"
    return [
        Row(
            scenario,
            "utilization",
            pct(fig["utilization"]),
            f">= {pct(util_target)}",
            fig["utilization"] >= util_target,
            note,
        ),
        Row(
            scenario,
            "429 share",
            pct(fig["share_429"]),
            f"<= {pct(share_target)}",
            fig["share_429"] <= share_target,
            f"{fig['limited']} of {fig['requests']} requests",
        ),
    ]


ONE_NODE = {"workers": 2, "sessions_per_worker": 16}
"""Both scenarios join a running local Ray (as on a cluster), so one node and two compare like for like."""


def known(ctx: Context) -> list[Row]:
    """Known limit: ``governor.rpm`` = the provider's limit."""
    address, env = ctx.ray_cluster(1)
    fig = run_case(ctx, "known", adaptive=False, ray=ONE_NODE, ray_address=address, env=env)
    ctx.results["known"] = fig
    return _rows(f"known limit ({LIMIT_RPM:.0f} rpm)", fig, 0.95, 0.01)


def adaptive(ctx: Context) -> list[Row]:
    """Unknown limit: AIMD on 429s, starting at a quarter of the limit."""
    address, env = ctx.ray_cluster(1)
    fig = run_case(ctx, "adaptive", adaptive=True, ray=ONE_NODE, ray_address=address, env=env)
    ctx.results["adaptive"] = fig
    return _rows(f"adaptive ({LIMIT_RPM:.0f} rpm unknown)", fig, 0.85, 0.05)


def cluster(ctx: Context) -> list[Row]:
    """The same on a 2-node local Ray cluster: the budget must be global, not per node."""
    rows: list[Row] = []
    cases = [("known", False, 0.95, 0.01)] + ([] if ctx.quick else [("adaptive", True, 0.85, 0.05)])
    address, env = ctx.ray_cluster(2)
    # 0.75 CPU per actor on 2-CPU nodes: at most two actors fit a node, so four must use both.
    ray = {"workers": 4, "sessions_per_worker": 8, "num_cpus_per_worker": 0.75}
    for label, is_adaptive, util_t, share_t in cases:
        fig = run_case(ctx, f"cluster-{label}", adaptive=is_adaptive, ray=ray, ray_address=address, env=env)
        ctx.results[f"cluster-{label}"] = fig
        scenario = f"2-node cluster, {label}"
        got = _rows(scenario, fig, util_t, share_t)
        nodes = len(fig["nodes"])
        got[0].note += f"; sessions on {nodes} nodes {sorted(fig['nodes'].values())}"
        if nodes < 2:
            got[0].met = False
        rows += got
        single = ctx.results.get(label)
        if single is not None:
            ratio = fig["utilization"] / single["utilization"]
            rows.append(Row(scenario, "utilization vs one node", f"{ratio:.2f}x", ">= 0.97x", ratio >= 0.97))
    return rows
