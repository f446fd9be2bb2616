"""The central path's ceiling (issue 27): N prompts (20,000; ``--prompts N``) through the whole run with a
model and an environment that cost nothing (the in-process scripted model at zero latency, the ``fake``
environment, 2 actors x 256 sessions), so that only raygen's one-per-run pieces cost anything: the
pre-launch checks, Ray's start, the run control actor, the governor service, the driver's sink, the merge.

The run is ``raygen.run.driver.run`` (what the CLI calls) in a child process (``python -m bench.ceiling
CONFIG DATASET STAMPS [resume]``) that stamps its phases: the checks (launch to the hygiene report: imports,
validation + hygiene in one read), the plan and Ray's start (to Ray Data's actor note), the sessions (to
the last session's end, from the records), the merge (``merge_run`` wrapped) and what follows it (the leak
count, statistics). Every process of its tree is sampled from /proc; the driver (the child itself), the
control actor (``ray::RunControl``) and the governor (``ray::GovernorService``) are followed by name:
CPU seconds over the whole run and over the sessions' window, and peak RSS.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import MIB, Context, Row, child_env, load_run, run_measured, tail
from bench.procs import TreeSampler, _read_stat

TASKS = Path("/work/shared/datasets/agent-tasks.jsonl")
THREE_NODES_UP_TO = 100_000
"""Larger runs (``--prompts 1000000``) run on one node only: the 3-node variant would double their time."""
ROLES = {"control": "ray::RunControl", "governor": "ray::GovernorSe"}
"""Process names (``comm``: Ray's title, cut at 15 characters) of the central actors."""


def write_tasks(path: Path, count: int, source: Path = TASKS) -> Path:
    """``count`` unique prompts from the shared task set, cycled, each prefixed ``Task N: ``."""
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    with path.open("w", encoding="utf-8") as f:
        for i in range(count):
            row = rows[i % len(rows)]
            out = {"id": f"task-{i}", "prompt": f"Task {i}: {row['prompt']}"}
            if row.get("category"):
                out["category"] = row["category"]
            f.write(json.dumps(out) + "\n")
    return path


@dataclass
class RoleSampler(TreeSampler):
    """A ``TreeSampler`` that also keeps, per central role, its CPU seconds over time and its peak RSS."""

    series: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    peak: dict[str, int] = field(default_factory=dict)
    driver: int = 0
    """The driver's pid: the root, or (joining a cluster this process started) the child."""

    def _role(self, pid: int, name: str) -> str | None:
        if pid == (self.driver or self.root):
            return "driver"
        return next((role for role, prefix in ROLES.items() if name.startswith(prefix)), None)

    def sample(self):  # type: ignore[no-untyped-def]
        got = super().sample()
        cpu = {"driver": 0.0, "control": 0.0, "governor": 0.0}
        rss = dict.fromkeys(cpu, 0)
        for proc in list(self._procs.values()):
            role = self._role(proc.pid, proc.name)
            if role is not None:
                cpu[role] += proc.self_s
                rss[role] += proc.rss if proc.dead_at is None else 0
        for role, value in rss.items():
            self.peak[role] = max(self.peak.get(role, 0), value)
        self.series.append((got.t, cpu))
        return got

    def kill_all(self, sig: int) -> None:
        """Never this process itself (the root when the run joins a cluster started here)."""
        self._procs = {key: p for key, p in self._procs.items() if p.pid != os.getpid()}
        super().kill_all(sig)

    def role_cpu_at(self, role: str, t: float) -> float:
        before = [cpu[role] for ts, cpu in self.series if ts <= t]
        after = [cpu[role] for ts, cpu in self.series if ts >= t]
        if not before:
            return after[0] if after else 0.0
        return before[-1] if not after else (before[-1] + after[0]) / 2

    def role_total(self, role: str) -> float:
        return self.series[-1][1][role] if self.series else 0.0


def _sizes(ctx: Context) -> int:
    return ctx.prompts or (2000 if ctx.quick else 20_000)


def run(ctx: Context) -> list[Row]:
    prompts = _sizes(ctx)
    work = ctx.dir("ceiling")
    dataset = write_tasks(work / "prompts.jsonl", prompts)
    got = run_ceiling(ctx, work, dataset, nodes=1)
    ctx.results["ceiling"] = got
    rows = rows_for(got, f"ceiling, {prompts} prompts, 1 node")
    if not ctx.quick and prompts <= THREE_NODES_UP_TO:
        # 3 Ray nodes on this machine (2 logical CPUs each, one actor per node): the central pieces with
        # 3 actors; on 2 real cores it cannot move more sessions than one node.
        ctx.close()
        three = ctx.dir("ceiling3")
        got3 = run_ceiling(ctx, three, dataset, nodes=3)
        ctx.results["ceiling3"] = got3
        ctx.close()
        rows += rows_for(got3, f"ceiling, {prompts} prompts, 3 nodes")
    return rows


def run_ceiling(ctx: Context, work: Path, dataset: Path, *, nodes: int) -> dict[str, Any]:
    """One measured run of ``dataset``; the figures as a dict (also for results.json)."""
    config = {
        "model": {"type": "scripted", "latency_s": 0},
        "env": {"type": "fake"},
        "ray": {"workers": 2, "sessions_per_worker": 256}
        if nodes == 1
        else {"workers": 3, "sessions_per_worker": 256, "num_cpus_per_worker": 1.5},
        "output": {"output_dir": str(work / "runs"), "run_name": "ceiling"},
    }
    if nodes > 1:  # the cluster's processes are this process's children: sampled from here
        config["ray"]["address"] = ctx.ray_cluster(nodes)[0]
    # Extra settings for an experiment, e.g. CEILING_CONFIG='{governor: {lease_size: 64}}' (YAML).
    for section, values in (yaml.safe_load(os.environ.get("CEILING_CONFIG", "")) or {}).items():
        config[section] = {**config.get(section, {}), **values}
    cfg_path, stamps_path = work / "run.yaml", work / "stamps.json"
    cfg_path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "bench.ceiling", str(cfg_path), str(dataset), str(stamps_path)]
    launch = time.time()
    log_path = work / "raygen.log"
    sampler = RoleSampler(0)  # its root is the child, once started (_measure)
    measured = _measure(cmd, log_path, sampler, whole_tree=nodes > 1)
    if measured != 0:
        raise RuntimeError(f"ceiling run exited {measured}:\n{tail(log_path)}")
    stamps = json.loads(stamps_path.read_text())
    times = load_run(work / "runs" / "ceiling")
    first, last = times.first_start, times.last_end
    window = {
        role: sampler.role_cpu_at(role, last) - sampler.role_cpu_at(role, first) for role in sampler.peak
    }
    return {
        "prompts": sum(1 for _ in dataset.open()),
        "sessions": times.count,
        "failed": times.failed,
        "phases_s": {
            "checks": stamps["checked"] - launch,
            "plan + ray start": stamps["ray_ready"] - stamps["checked"],
            "actors to first session": first - stamps["ray_ready"],
            "sessions": last - first,
            "last session to passes' end (Ray Data's iteration ending)": stamps["passes_end"] - last,
            "passes' end to merge start": stamps["merge_start"] - stamps["passes_end"],
            "merge": stamps["merge_end"] - stamps["merge_start"],
            "after merge (leak count, statistics, Ray's shutdown)": stamps["returned"] - stamps["merge_end"],
        },
        "driver_cpu_s": {
            "checks (imports, validation, hygiene)": stamps["checked_cpu"],
            "plan + ray start": stamps["ray_ready_cpu"] - stamps["checked_cpu"],
            "passes": stamps["merge_start_cpu"] - stamps["ray_ready_cpu"],
            "merge": stamps["merge_end_cpu"] - stamps["merge_start_cpu"],
            "compaction during the run (merge workers)": stamps.get("compaction_cpu", 0.0),
            "merge workers": stamps["merge_workers_cpu"],
            "after merge": stamps["returned_cpu"] - stamps["merge_end_cpu"],
        },
        "launch_to_exit_s": time.time() - launch,
        "sessions_per_s": times.rate,
        "cpu_window_s": window,
        "cpu_total_s": {role: sampler.role_total(role) for role in sampler.peak},
        "peak_rss": dict(sampler.peak),
        "by_name": sampler.cpu_by_name(),
        "nodes": nodes,
        "sessions_by_node": dict(times.nodes),
    }


def _measure(cmd: list[str], log_path: Path, sampler: RoleSampler, whole_tree: bool) -> int:
    def adopt(root: int) -> RoleSampler:
        sampler.root, sampler.driver = (os.getpid(), root) if whole_tree else (root, 0)
        return sampler

    return run_measured(cmd, log_path, timeout_s=1800, env=child_env(), make_sampler=adopt).returncode


def rows_for(got: dict[str, Any], scenario: str) -> list[Row]:
    sessions = max(got["sessions"], 1)
    phases = got["phases_s"]
    window, total, peak = got["cpu_window_s"], got["cpu_total_s"], got["peak_rss"]
    central = sum(window.values()) / sessions * 1000
    before_merge = sum(s for name, s in phases.items() if name.startswith(("last session", "passes' end")))
    end = before_merge + phases["merge"]
    per_role = ", ".join(
        f"{role} {window[role] / sessions * 1000:.3f} ms/session ({total[role]:.1f} s whole run, "
        f"peak RSS {peak[role] / MIB:.0f} MiB)"
        for role in ("driver", "control", "governor")
    )
    cpu = "; ".join(f"{name} {s:.1f} s" for name, s in got["driver_cpu_s"].items())
    compaction = got["driver_cpu_s"].get("compaction during the run (merge workers)", 0.0)
    return [
        Row(scenario, "driver CPU per phase", f"{sum(got['driver_cpu_s'].values()):.1f} s", "", None, cpu),
        Row(scenario, "launch to exit", f"{got['launch_to_exit_s']:.1f} s", "", None,
            "; ".join(f"{name} {s:.1f} s" for name, s in phases.items())),
        Row(scenario, "sessions/s", f"{got['sessions_per_s']:.0f}", "", None,
            f"{got['sessions']} sessions ({got['failed']} failed), first start to last end; per node "
            f"{sorted(got['sessions_by_node'].values(), reverse=True)}"),
        Row(scenario, "last session to merge end", f"{end:.1f} s", "<= 5 s", end <= 5,
            f"to merge start {before_merge:.1f} s (Ray Data's iteration ending), "
            f"merge_run {phases['merge']:.1f} s: CPU {got['driver_cpu_s']['merge']:.1f} s driver + "
            f"{got['driver_cpu_s']['merge workers']:.1f} s its workers (load stretches wall time); "
            f"before it, {compaction:.1f} s of the workers' CPU digesting shards during the run "
            f"({compaction / sessions * 1000:.3f} ms/session)"),
        Row(scenario, "central CPU per session", f"{central:.3f} ms", "<= 0.2 ms", central <= 0.2,
            f"over the sessions' window: {per_role}"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ the child


def _workers_cpu(workers: Any) -> float:
    """CPU seconds of the merge's forked workers (``MergeWorkers``) so far, from /proc."""
    if workers is None:
        return 0.0
    return sum(stat[3] for pid in workers.pool._processes if (stat := _read_stat(pid)) is not None)


def child(argv: list[str]) -> int:
    """The run itself, stamping its phases into ``argv[2]``."""
    config_path, dataset, stamps_path = Path(argv[0]), argv[1], Path(argv[2])
    resume = argv[3:] == ["resume"]  # bench/ceiling_resume.py's second invocation
    import raygen.run.driver as driver
    from raygen.configfile import load_config
    from raygen.run.reporter import RunReporter

    stamps: dict[str, float] = {}

    def stamp(name: str) -> None:  # wall time, and this process's CPU so far (the machine is shared)
        stamps[name], stamps[name + "_cpu"] = time.time(), time.process_time()
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # the merge's workers, once it ended
        stamps[name + "_children_cpu"] = reaped.ru_utime + reaped.ru_stime

    real_merge = driver.merge_run

    def timed_merge(*args: Any, **kwargs: Any) -> Any:
        stamp("merge_start")
        workers = kwargs.get("workers")
        before = _workers_cpu(workers)
        stamps["compaction_cpu"] = before  # the workers' CPU so far: shard digests built during the run
        try:
            return real_merge(*args, **kwargs)
        finally:
            stamp("merge_end")
            if workers is None:  # the merge forked its own, reaped by its end
                stamps["merge_workers_cpu"] = (
                    stamps["merge_end_children_cpu"] - stamps["merge_start_children_cpu"]
                )
            else:  # forked before Ray started, still alive: from /proc
                stamps["merge_workers_cpu"] = _workers_cpu(workers) - before

    class Stamping(RunReporter):
        def hygiene_checked(self, report: Any, *, refused: bool) -> None:
            stamp("checked")
            super().hygiene_checked(report, refused=refused)

        def note(self, text: str) -> None:
            if "core_worker.cc" in text:  # printed right after Ray is up (raygen.distributed.cluster)
                stamp("ray_ready")
            super().note(text)

    real_passes = driver.run_passes

    def timed_passes(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_passes(*args, **kwargs)
        finally:
            stamp("passes_end")

    driver.merge_run = timed_merge  # type: ignore[assignment]
    driver.run_passes = timed_passes  # type: ignore[assignment]
    config = load_config(config_path, {"dataset": dataset})
    result = driver.run(config, reporter=Stamping(), resume=resume)
    stamp("returned")
    stats = result.merge.stats["counts"] if result.merge else {}
    stamps_path.write_text(json.dumps({**stamps, "counts": stats, "sessions_run": result.sessions_run}))
    return 75 if result.incomplete else 0  # as `raygen run` exits after a drain


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
