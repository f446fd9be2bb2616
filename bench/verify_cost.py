"""What verification adds per session: wall seconds and CPU, in both modes, on the local and Docker backends.

Sessions of the simulator's coding script (``ScriptedModel``, no HTTP, no Ray: the figures are the
session's own) on the vendored verified tasks (``tests/data/verified-tasks.jsonl``, HumanEval), one at a
time, three ways per backend, interleaved: no check, ``mode: fresh`` and ``mode: same``. Each session
writes solution.py, imports it in the shell and answers; the check stages the hidden test and runs
``python3 test_hidden.py``.

Figures: **added wall s/session** = median session time with the check - without; the check's own
``verification.duration_s`` (median) is in the notes. **added CPU s/session** = this process's CPU plus
its reaped children's (``getrusage``), mean per session, with - without. On Docker the commands run under
the engine, not under this process, so its CPU figure counts only the client side (API calls, tar streams).
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import time
from pathlib import Path

from bench.common import Context, Row
from bench.sandboxes import _docker_problem
from raygen.config import DockerEnvConfig, LocalEnvConfig, ScriptedModelConfig, SessionConfig, SimConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.scripted import ScriptedModel
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
PYTHON_IMAGE = "raygen-test/python"


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _samples(mode: str | None, image: str | None, count: int) -> list[Sample]:
    rows = [json.loads(line) for line in (DATA / "verified-tasks.jsonl").read_text().splitlines()]
    out = []
    for i in range(count):
        row = dict(rows[i % len(rows)], image=image)
        if mode is None:
            row.pop("verify")
        else:
            row["verify"] = {**row["verify"], "mode": mode}
        out.append(
            Sample(
                row=PromptRow.model_validate(row),
                sample_key=f"{i:024d}",
                prompt_index=i,
                line=i + 1,
                toolsets=["file", "terminal"],
            )
        )
    return out


MODES = (None, "fresh", "same")
"""No check, then the two modes: run interleaved, one session of each in turn, so a change of load on a
shared machine hits all three alike."""


async def _measure(env_config, image: str | None, count: int) -> dict[str | None, dict[str, float]]:
    sim = SimConfig(solutions_file=DATA / "verified-tasks.solutions.jsonl", solve_rate=0.5)
    runner = SessionRunner(
        model=ScriptedModel(ScriptedModelConfig(), sim),
        registry=load_registry([]),
        env_config=env_config,
        session=SessionConfig(),
        run_name="bench-verify",
    )
    samples = {mode: _samples(mode, image, count) for mode in MODES}
    walls: dict[str | None, list[float]] = {mode: [] for mode in MODES}
    cpus: dict[str | None, list[float]] = {mode: [] for mode in MODES}
    checks: dict[str | None, list[float]] = {mode: [] for mode in MODES}
    passed = dict.fromkeys(MODES, 0)
    for i in range(count):
        for mode in MODES:
            cpu0, t0 = _cpu_s(), time.perf_counter()
            record = await runner.run(samples[mode][i])
            walls[mode].append(time.perf_counter() - t0)
            cpus[mode].append(_cpu_s() - cpu0)
            if record.exit_status not in ("completed", "max_turns"):
                raise RuntimeError(f"bench session failed: {record.exit_status}: {record.error}")
            if record.verification is not None:
                checks[mode].append(record.verification.duration_s)
                passed[mode] += record.reward == 1.0
    return {
        mode: {
            "wall_median_s": statistics.median(walls[mode]),
            "cpu_mean_s": statistics.mean(cpus[mode]),
            "check_median_s": statistics.median(checks[mode]) if checks[mode] else 0.0,
            "passed": passed[mode],
            "sessions": count,
        }
        for mode in MODES
    }


def run(ctx: Context) -> list[Row]:
    count = 6 if ctx.quick else 30
    backends: list[tuple[str, object, str | None]] = [("local", LocalEnvConfig(), None)]
    problem = _docker_problem()
    if problem is None:
        backends.append(("docker", DockerEnvConfig(cpus=1.0, memory="512m"), PYTHON_IMAGE))
    rows, figures = [], {}
    for name, env_config, image in backends:
        got = asyncio.run(_measure(env_config, image, count))
        base = got[None]
        for mode in ("fresh", "same"):
            m = got[mode]
            figures[f"{name}/{mode}"] = m
            note = (
                f"the check itself {m['check_median_s']:.3f} s; session {base['wall_median_s']:.3f} -> "
                f"{m['wall_median_s']:.3f} s (medians); {m['passed']}/{count} passed"
            )
            added = m["wall_median_s"] - base["wall_median_s"]
            rows.append(Row("verify", f"{name} {mode}: added wall s/session", f"{added:.3f}", note=note))
            where = (
                "client side only: commands run under the engine"
                if name == "docker"
                else "process + children"
            )
            rows.append(
                Row(
                    "verify",
                    f"{name} {mode}: added CPU s/session",
                    f"{m['cpu_mean_s'] - base['cpu_mean_s']:.3f}",
                    note=f"{base['cpu_mean_s']:.3f} -> {m['cpu_mean_s']:.3f} s (means); {where}",
                )
            )
        figures[f"{name}/none"] = base
    if problem is not None:
        rows.append(Row("verify", "docker", "skipped", note=problem))
    ctx.results["verify"] = figures
    return rows
