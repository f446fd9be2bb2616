"""Shared pieces of the scenarios: result rows, prompt files, the simulator, and running ``raygen run``
as a subprocess while its whole process tree is sampled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.procs import MARK_ENV, TreeSampler
from raygen.config import SimConfig
from raygen.sim.launch import SimProcess, start_subprocess

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "RAYGEN_BENCH_KEY"
"""The simulator accepts any key; raygen insists on reading one from the environment."""
KEY_VALUE = "sim-accepts-anything"
GIB = 1024**3
MIB = 1024**2


@dataclass
class Row:
    """One line of the results table."""

    scenario: str
    figure: str
    value: str
    target: str = ""
    met: bool | None = None
    note: str = ""


@dataclass
class Context:
    """What every scenario gets: where to work and how big to be."""

    work: Path
    quick: bool
    log: Any = print
    kinds: list[str] | None = None
    """``--kinds``: the rate-limit scenarios' ways of counting to run (labels such as ``sliding 10 s``)."""
    prompts: int | None = None
    """``--prompts N``: the size of the ``ceiling`` scenario (default 20,000; ``--quick`` 2,000)."""
    results: dict[str, Any] = field(default_factory=dict)
    """Raw figures by scenario, written to results.json (and shared: the cluster compares with one node)."""
    _cluster: Any = None
    _cluster_nodes: int = 0

    def ray_cluster(self, nodes: int) -> tuple[str, dict[str, str]]:
        """A local Ray cluster of ``nodes`` nodes shared by the scenarios that join one (started on first
        use, replaced when another size is asked for, stopped by ``close``): (address, env for joiners)."""
        from bench.cluster import LocalCluster

        if self._cluster is None or self._cluster_nodes != nodes:
            self.close()
            self._cluster = LocalCluster(nodes)
            self._cluster_nodes = nodes
        return self._cluster.address, self._cluster.env

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def dir(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path


# ---------------------------------------------------------------------------------------- prompts


def write_prompts(path: Path, count: int, *, toolsets: list[str] | None = None, tag: str = "") -> Path:
    """``count`` distinct prompts (distinct prompts: the simulator keys each session's plan on it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i in range(count):
            row: dict[str, Any] = {"id": f"{tag or path.stem}-{i:05d}", "prompt": f"Bench task {tag} {i}."}
            if toolsets is not None:
                row["toolsets"] = toolsets
            f.write(json.dumps(row) + "\n")
    return path


# ---------------------------------------------------------------------------------------- simulator


class Sim:
    """The simulator as its own process, with its counters."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.proc: SimProcess = start_subprocess(cfg)
        self.url = self.proc.url
        self._root = self.url.removesuffix("/v1")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self._root + "/sim/stats", timeout=10) as resp:
            return json.load(resp)

    def reset(self) -> None:
        req = urllib.request.Request(self._root + "/sim/reset", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self) -> Sim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_request_log(path: Path) -> list[dict[str, Any]]:
    """The simulator's JSONL request log (``SimConfig.log_path``), after it stopped."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------- subprocesses


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env[KEY_ENV] = KEY_VALUE
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.update(extra or {})
    return env


@dataclass
class Measured:
    """A finished subprocess and what its process tree cost."""

    returncode: int
    wall_s: float
    sampler: TreeSampler
    log_path: Path
    machine: TreeSampler | None = None
    """With ``machine=True``: every process of the run, found by its environment mark (bench.procs)."""


def run_measured(
    cmd: list[str],
    log_path: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    pss: bool = False,
    machine: bool = False,
    cwd: Path = ROOT,
    make_sampler: Any = None,
) -> Measured:
    """Run ``cmd`` in its own session (in ``cwd``), sampling its process tree (and with ``machine``, every
    process carrying the run's environment mark); on timeout kill the whole tree. ``make_sampler(pid)``:
    a sampler of one's own (a ``TreeSampler`` subclass) instead of the plain one."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex[:12]
    env = {**(env or child_env()), MARK_ENV: mark}
    t0 = time.time()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=cwd,
        )
        marked = TreeSampler(proc.pid, mark=mark) if machine else None
        tree = make_sampler(proc.pid) if make_sampler else TreeSampler(proc.pid, pss=pss)
        with tree as sampler, marked or contextlib.nullcontext():
            try:
                code = proc.wait(timeout_s)
            except BaseException as exc:  # timeout or Ctrl-C: leave nothing running
                sampler.kill_all(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                sampler.kill_all(signal.SIGKILL)
                proc.wait()
                if not isinstance(exc, subprocess.TimeoutExpired):
                    raise
                code = -9
            sampler.sample()
            if marked is not None:
                marked.sample()
    return Measured(code, time.time() - t0, sampler, log_path, marked)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------- raygen


@dataclass
class SessionTimes:
    """Start and end times (epoch seconds) of the sessions of one runner, plus their outcomes."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.ends)

    @property
    def first_start(self) -> float:
        return min(self.starts)

    @property
    def last_end(self) -> float:
        return max(self.ends)

    @property
    def makespan_s(self) -> float:
        return self.last_end - self.first_start if self.ends else 0.0

    @property
    def rate(self) -> float:
        """Sessions per second from the first start to the last end (start-up and merge excluded)."""
        return self.count / self.makespan_s if self.makespan_s > 0 else 0.0

    def busy_window(self, at_least: int) -> tuple[float, float] | None:
        """The span from the first moment ``at_least`` sessions were running at once to the last such
        moment: where demand was high for sure."""
        events = sorted([(t, 1) for t in self.starts] + [(t, -1) for t in self.ends])
        running, first, last = 0, None, None
        for t, delta in events:
            before = running
            running += delta
            if running >= at_least and first is None:
                first = t
            if before >= at_least > running:
                last = t
        return (first, last) if first is not None and last is not None and last > first else None


def _iso(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def load_run(run_dir: Path) -> SessionTimes:
    """Timings and outcomes of every session attempt in a raygen run folder (from its shards)."""
    times = SessionTimes()
    for shard in sorted((run_dir / "shards").glob("*.jsonl")):
        for line in shard.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            timing = rec.get("timing") or {}
            times.starts.append(_iso(timing["started_at"]))
            times.ends.append(_iso(timing["ended_at"]))
            status = rec.get("exit_status", "")
            times.statuses[status] = times.statuses.get(status, 0) + 1
            times.failed += status.startswith("error:")
            node = ((rec.get("env") or {}).get("node") or "?")[:8]
            times.nodes[node] = times.nodes.get(node, 0) + 1
    return times


@dataclass
class RaygenRun:
    measured: Measured
    times: SessionTimes
    run_dir: Path
    statistics: dict[str, Any]


def run_raygen(
    ctx: Context,
    name: str,
    dataset: Path,
    config: dict[str, Any],
    *,
    base_url: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    pss: bool = False,
    machine: bool = False,
) -> RaygenRun:
    """One raygen run of ``dataset`` with ``config`` against ``base_url`` (``bench.child`` in a subprocess),
    measured; raises if it fails."""
    work = ctx.dir(name)
    config = {
        **config,
        "model": {"base_url": base_url, "api_key_env": KEY_ENV, **config.get("model", {})},
        "output": {"output_dir": str(work / "runs"), "run_name": name, **config.get("output", {})},
    }
    cfg_path = work / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "bench.child", str(cfg_path), str(dataset)]
    log = work / "raygen.log"
    measured = run_measured(cmd, log, timeout_s=timeout_s, env=child_env(env), pss=pss, machine=machine)
    run_dir = work / "runs" / name
    if measured.returncode != 0:
        raise RuntimeError(f"raygen run {name} exited {measured.returncode}:\n{tail(measured.log_path)}")
    stats_path = run_dir / "statistics.json"
    statistics = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    return RaygenRun(measured, load_run(run_dir), run_dir, statistics)


def run_baseline(
    ctx: Context,
    name: str,
    runner: str,
    dataset: Path,
    *,
    concurrency: int,
    base_url: str,
    timeout_s: float,
    pss: bool = False,
    machine: bool = False,
) -> tuple[Measured, SessionTimes]:
    """One of ``bench.baselines``' runners in a subprocess, measured like raygen."""
    work = ctx.dir(name)
    out = work / "sessions.json"
    cmd = [sys.executable, "-m", "bench.baselines", runner, "--base-url", base_url]
    cmd += ["--dataset", str(dataset), "--concurrency", str(concurrency), "--out", str(out)]
    measured = run_measured(cmd, work / "runner.log", timeout_s=timeout_s, pss=pss, machine=machine)
    if measured.returncode != 0 or not out.exists():
        raise RuntimeError(f"{runner} runner exited {measured.returncode}:\n{tail(measured.log_path)}")
    data = json.loads(out.read_text())
    times = SessionTimes(starts=data["starts"], ends=data["ends"], failed=data["failed"])
    return measured, times


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
