"""Time from launching the command to the first model request: ``raygen run`` as a user types it vs the
asyncio runner (``bench.baselines``), side by side against one simulator that is already up.

The simulator (no latency, so a request's log time is its arrival) writes every request's time to its log;
a run's first request is the earliest one between its launch and its exit (runs take turns, never overlap).
raygen is the installed ``raygen`` command with nothing but the endpoint, the key's variable and the output
folder given: the default ``local`` environment, a private Ray started by the run. Its stderr lines are
timestamped as they arrive, which splits its start-up into: imports and validation (the "run NAME: N
samples" line), Ray up (the Ray Data note printed right after ``ray.init``), and the session actors and
pipeline until the first request. ``python -X importtime -c 'import raygen.cli'`` gives the CLI's import
cost by top-level package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import KEY_ENV, ROOT, Context, Row, Sim, child_env, read_request_log, tail, write_prompts
from raygen.config import SimConfig

PROMPTS = 2
TIMEOUT_S = 300.0
RAY_UP_LINE = "note: Ray logs one core_worker.cc"
"""Printed by ``run_services`` right after ``ensure_ray`` returns (``RAY_DATA_ACTOR_NOTE``)."""
PLANNED_LINE = " samples, "
"""The driver's "run NAME: N samples, M already done" line: config, dataset and hygiene checks done."""


@dataclass
class Launch:
    """One timed invocation: when it started and ended, and its output lines with their arrival times."""

    name: str
    started: float
    ended: float = 0.0
    returncode: int = 0
    lines: list[tuple[float, str]] = field(default_factory=list)
    first_request: float | None = None

    def since_start(self, marker: str) -> float | None:
        return next((t - self.started for t, line in self.lines if marker in line), None)

    @property
    def to_first_request(self) -> float | None:
        return None if self.first_request is None else self.first_request - self.started


def launch(name: str, cmd: list[str], log_path: Path, env: dict[str, str]) -> Launch:
    """Run ``cmd`` in its own session, stamping each output line with its arrival time; kill the whole
    session on timeout."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run = Launch(name, started=time.time())
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        text=True,
        errors="replace",
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            run.lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run.returncode = proc.wait(TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        run.returncode = proc.wait()
    run.ended = time.time()
    reader.join(10)
    log_path.write_text("".join(f"{t - run.started:8.3f} {line}\n" for t, line in run.lines))
    if run.returncode != 0:
        raise RuntimeError(f"{name} exited {run.returncode}:\n{tail(log_path)}")
    return run


def raygen_command(ctx: Context, name: str, dataset: Path, base_url: str) -> list[str]:
    script = Path(sys.executable).with_name("raygen")
    cli = (
        [str(script)] if script.exists() else [sys.executable, "-c", "from raygen.cli.main import app; app()"]
    )
    out = ctx.dir("startup") / "runs"
    args = ["run", str(dataset), "--base-url", base_url, "--api-key-env", KEY_ENV]
    return cli + args + ["--output-dir", str(out), "--run-name", name]


def asyncio_command(ctx: Context, name: str, dataset: Path, base_url: str) -> list[str]:
    out = ctx.dir("startup") / f"{name}.json"
    cmd = [sys.executable, "-m", "bench.baselines", "asyncio", "--base-url", base_url]
    return [*cmd, "--dataset", str(dataset), "--concurrency", str(PROMPTS), "--out", str(out)]


def import_breakdown(top: int = 5) -> tuple[float, list[tuple[str, float]]]:
    """``import raygen.cli`` under ``-X importtime``: total seconds and the largest top-level packages
    (their modules' own times summed)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import raygen.cli"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        check=True,
    )
    by_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header line
        package = parts[2].strip().split(".")[0]
        by_package[package] = by_package.get(package, 0.0) + int(parts[0]) / 1e6
    ranked = sorted(by_package.items(), key=lambda kv: -kv[1])
    return sum(by_package.values()), ranked[:top]


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def run(ctx: Context) -> list[Row]:
    work = ctx.dir("startup")
    dataset = write_prompts(work / "prompts.jsonl", PROMPTS, toolsets=["terminal"], tag="startup")
    trials = 2 if ctx.quick else 3
    env = child_env()
    env.pop("RAY_ADDRESS", None)  # a private Ray, as a user without a cluster gets
    sim_log = work / "sim-requests.jsonl"
    sim_log.unlink(missing_ok=True)
    launches: dict[str, list[Launch]] = {"raygen": [], "asyncio": []}
    commands = {"raygen": raygen_command, "asyncio": asyncio_command}
    with Sim(SimConfig(latency_s=0.0, log_path=sim_log)) as sim:
        for i in range(trials):
            # Alternating order, so a slow moment of the shared machine does not land on one runner only.
            order = ["raygen", "asyncio"] if i % 2 == 0 else ["asyncio", "raygen"]
            for runner in order:
                name = f"{runner}-{i}"
                ctx.log(f"startup: {name}")
                cmd = commands[runner](ctx, name, dataset, sim.url)
                launches[runner].append(launch(name, cmd, work / f"{name}.log", env))
    requests = sorted(r["ts"] for r in read_request_log(sim_log))
    for runs in launches.values():
        for one in runs:
            one.first_request = next((t for t in requests if one.started <= t <= one.ended), None)
    import_s, packages = import_breakdown()

    raygen_runs, asyncio_runs = launches["raygen"], launches["asyncio"]
    raygen_first = _median([r.to_first_request for r in raygen_runs])
    asyncio_first = _median([r.to_first_request for r in asyncio_runs])
    planned = _median([r.since_start(PLANNED_LINE) for r in raygen_runs])
    ray_up = _median([r.since_start(RAY_UP_LINE) for r in raygen_runs])

    def each(runs: list[Launch]) -> str:
        return ", ".join(_s(r.to_first_request) for r in runs)

    def whole(runs: list[Launch]) -> str:
        return _s(statistics.median(r.ended - r.started for r in runs))

    ctx.results["startup"] = {
        runner: [
            {
                "to_first_request_s": r.to_first_request,
                "wall_s": r.ended - r.started,
                "planned_s": r.since_start(PLANNED_LINE),
                "ray_up_s": r.since_start(RAY_UP_LINE),
            }
            for r in runs
        ]
        for runner, runs in launches.items()
    }
    ctx.results["startup"]["import_raygen_cli"] = {"total_s": import_s, "by_package": packages}
    scenario = f"startup, {PROMPTS} prompts"
    rows = [
        Row(
            scenario,
            "raygen run: to first request",
            _s(raygen_first),
            note=f"median of {trials}: {each(raygen_runs)}; whole run {whole(raygen_runs)}",
        ),
        Row(
            scenario,
            "asyncio runner: to first request",
            _s(asyncio_first),
            note=f"median of {trials}: {each(asyncio_runs)}; whole run {whole(asyncio_runs)}",
        ),
    ]
    if raygen_first is not None and asyncio_first is not None:
        rows.append(Row(scenario, "raygen - asyncio runner", _s(raygen_first - asyncio_first)))
    if planned is not None and ray_up is not None and raygen_first is not None:
        rows.append(
            Row(
                scenario,
                "raygen: where the time goes",
                f"{planned:.2f} + {ray_up - planned:.2f} + {raygen_first - ray_up:.2f} s",
                note="imports, config and dataset checks + Ray start + session actors and pipeline until "
                "the first request (medians)",
            )
        )
    rows.append(
        Row(
            scenario,
            "import raygen.cli",
            _s(import_s),
            note="-X importtime, own time by package: "
            + ", ".join(f"{name} {1000 * sec:.0f} ms" for name, sec in packages),
        )
    )
    return rows
