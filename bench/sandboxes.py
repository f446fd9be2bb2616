"""Environment backends: start / exec / stop latency of one sandbox, and Docker sessions/s through raygen.

Latency: ``Environment.start()``, one ``exec("echo ok")`` and ``close()`` timed one after the other, many
times, per backend (``fake``, ``local``, ``local`` with its per-command subreaper script instead of the
command spawner, ``local`` with bubblewrap if installed, ``docker`` with the
``raygen-test/busybox`` image if ``DOCKER_HOST`` is set); medians in milliseconds, p90 in the notes.
Modal needs its cloud and Singularity an apptainer install: not measured here.

Docker sessions/s: full raygen runs (the simulator at its default 50 ms latency, default toolsets, so a
session is three model calls, a shell command and a file write + read in its own container) with 16 and
64 sessions, hence containers, at once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from bench.common import Context, Row, Sim, run_raygen, write_prompts
from raygen.config import DockerEnvConfig, FakeEnvConfig, LocalEnvConfig, SimConfig
from raygen.envs import EnvSpec, ExecResult, create_environment, local

IMAGE = "raygen-test/busybox"
_SCRIPT_LABEL = "local, subreaper script per command (the spawner's fallback)"


def _docker_problem() -> str | None:
    """Why the Docker figures cannot be measured here, or None."""
    if not os.environ.get("DOCKER_HOST"):
        return 'DOCKER_HOST is unset (eval "$(.ci/docker-setup.sh /tmp/rg-docker)" first)'
    try:
        found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"docker CLI unusable: {exc}"
    if found.returncode != 0:
        return f"image {IMAGE} missing (run .ci/build-test-images.sh)"
    return None


class _Bare:
    """Reference, not a raygen backend: a temp dir, ``bash -c`` through asyncio, ``rmtree``."""

    type = "bare"

    async def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-bare-")

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        return ExecResult(proc.returncode or 0, out.decode(), err.decode())

    async def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


async def _cycle(config, index: int) -> tuple[float, float, float]:
    spec = EnvSpec(session_key=f"bench-{index}-{time.time_ns()}", run_name="bench-sandboxes", image=IMAGE)
    env = _Bare() if config == "bare" else create_environment(config, spec)
    t0 = time.perf_counter()
    await env.start()
    t1 = time.perf_counter()
    try:
        result = await env.exec("echo ok", timeout_s=30, max_output_chars=1000)
        if result.exit_code != 0 or "ok" not in result.stdout:
            raise RuntimeError(f"{type(env).__name__}: echo failed: {result}")
        t2 = time.perf_counter()
    finally:
        await env.close()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


async def _latencies(config, repeats: int) -> list[tuple[float, float, float]]:
    await _cycle(config, -1)  # warm-up: imports, engine connection
    return [await _cycle(config, i) for i in range(repeats)]


def _ms(values: list[float], q: float = 0.5) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(ctx: Context) -> list[Row]:
    repeats = 5 if ctx.quick else 30
    docker_problem = _docker_problem()
    backends = [
        ("bare bash -c (reference)", "bare"),
        ("fake", FakeEnvConfig()),
        ("local", LocalEnvConfig()),
        (_SCRIPT_LABEL, LocalEnvConfig()),
    ]
    if shutil.which("bwrap"):
        backends.append(("local + bwrap", LocalEnvConfig(bwrap=True)))
    if docker_problem is None:
        backends.append(("docker", DockerEnvConfig(default_image=IMAGE, pull="never")))
    rows: list[Row] = []
    figures: dict[str, dict[str, float]] = {}
    for label, config in backends:
        # The per-command subreaper script: what local did before the spawner, and its fallback now.
        local.USE_SPAWNER = label != _SCRIPT_LABEL
        try:
            cycles = asyncio.run(_latencies(config, repeats))
        finally:
            local.USE_SPAWNER = True
        start, exec_, stop = (list(x) for x in zip(*cycles, strict=True))
        figures[label] = {"start_ms": _ms(start), "exec_ms": _ms(exec_), "stop_ms": _ms(stop)}
        rows.append(
            Row(
                "sandbox latency",
                f"{label}: start / exec / stop",
                f"{_ms(start):.1f} / {_ms(exec_):.1f} / {_ms(stop):.1f} ms",
                note=f"median of {repeats}; p90 {_ms(start, 0.9):.1f} / {_ms(exec_, 0.9):.1f} / "
                f"{_ms(stop, 0.9):.1f} ms",
            )
        )
    if docker_problem is not None:
        ctx.log(f"sandboxes: Docker skipped: {docker_problem}")
        rows.append(Row("sandbox latency", "docker", "skipped", note=docker_problem))
    else:
        rows += _docker_throughput(ctx, figures)
    ctx.results["sandboxes"] = figures
    return rows


def _docker_throughput(ctx: Context, figures: dict) -> list[Row]:
    rows: list[Row] = []
    with Sim(SimConfig()) as sim:
        # (containers at once, sessions): two or more waves in a full run; --quick: one wave of 16 only
        sizes = ((16, 16),) if ctx.quick else ((16, 96), (64, 128))
        for concurrency, sessions in sizes:
            workers = 2
            name = f"docker-{concurrency}"
            dataset = write_prompts(ctx.dir(name) / "prompts.jsonl", sessions, tag=name)
            config = {
                "env": {"type": "docker", "default_image": IMAGE, "pull": "never"},
                "ray": {"workers": workers, "sessions_per_worker": concurrency // workers},
            }
            got = run_raygen(ctx, name, dataset, config, base_url=sim.url, timeout_s=900)
            times = got.times
            durations = [e - s for s, e in zip(times.starts, times.ends, strict=True)]
            figures[name] = {"rate": times.rate, "sessions": times.count, "failed": times.failed}
            rows.append(
                Row(
                    "docker sessions",
                    f"{concurrency} containers at once: sessions/s",
                    f"{times.rate:.1f}",
                    note=f"{times.count} sessions ({times.failed} failed), median session "
                    f"{statistics.median(durations):.2f} s, {workers} workers",
                )
            )
    return rows
