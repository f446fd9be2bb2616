"""What verification adds per session: wall seconds and CPU, in both modes, on the local and Docker backends.

Sessions of the simulator's coding script (``ScriptedModel``, no HTTP, no Ray: the figures are the
session's own) on the vendored verified tasks (``tests/data/verified-tasks.jsonl``, HumanEval), one at a
time, three ways per backend: without a check, with ``mode: fresh`` and with ``mode: same``. Each session
writes solution.py, imports it in the shell and answers; the check stages the hidden test and runs
``python3 test_hidden.py``.

Figures: **added wall s/session** = mean session time with the check - without; the check's own
``verification.duration_s`` is in the notes. **added CPU s/session** = this process's CPU plus its reaped
children's (``getrusage``), per session, with - without. On Docker the commands run under the engine, not
under this process, so its CPU figure counts only the client side (API calls, tar streams).
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


async def _measure(env_config, mode: str | None, image: str | None, count: int) -> dict[str, float]:
    sim = SimConfig(solutions_file=DATA / "verified-tasks.solutions.jsonl", solve_rate=0.5)
    runner = SessionRunner(
        model=ScriptedModel(ScriptedModelConfig(), sim),
        registry=load_registry([]),
        env_config=env_config,
        session=SessionConfig(),
        run_name="bench-verify",
    )
    walls, checks, rewards = [], [], []
    cpu0 = _cpu_s()
    for sample in _samples(mode, image, count):
        t0 = time.perf_counter()
        record = await runner.run(sample)
        walls.append(time.perf_counter() - t0)
        if record.exit_status not in ("completed", "max_turns"):
            raise RuntimeError(f"bench session failed: {record.exit_status}: {record.error}")
        if record.verification is not None:
            checks.append(record.verification.duration_s)
            rewards.append(record.reward)
    return {
        "wall_mean_s": statistics.mean(walls),
        "cpu_per_session_s": (_cpu_s() - cpu0) / count,
        "check_mean_s": statistics.mean(checks) if checks else 0.0,
        "passed": sum(1 for r in rewards if r == 1.0),
        "sessions": count,
    }


def run(ctx: Context) -> list[Row]:
    count = 6 if ctx.quick else 30
    backends: list[tuple[str, object, str | None]] = [("local", LocalEnvConfig(), None)]
    problem = _docker_problem()
    if problem is None:
        backends.append(("docker", DockerEnvConfig(cpus=1.0, memory="512m"), PYTHON_IMAGE))
    rows, figures = [], {}
    for name, env_config, image in backends:
        base = asyncio.run(_measure(env_config, None, image, count))
        figures[f"{name}/none"] = base
        for mode in ("fresh", "same"):
            got = asyncio.run(_measure(env_config, mode, image, count))
            figures[f"{name}/{mode}"] = got
            note = (
                f"check itself {got['check_mean_s']:.3f} s; session {base['wall_mean_s']:.3f} s -> "
                f"{got['wall_mean_s']:.3f} s; {got['passed']}/{count} passed; {count} sessions one at a time"
            )
            rows.append(
                Row(
                    "verify",
                    f"{name} {mode}: added wall s/session",
                    f"{got['wall_mean_s'] - base['wall_mean_s']:.3f}",
                    note=note,
                )
            )
            cpu_note = (
                "client side only (commands run under the engine)"
                if name == "docker"
                else "process + children"
            )
            rows.append(
                Row(
                    "verify",
                    f"{name} {mode}: added CPU s/session",
                    f"{got['cpu_per_session_s'] - base['cpu_per_session_s']:.3f}",
                    note=f"{base['cpu_per_session_s']:.3f} -> {got['cpu_per_session_s']:.3f} s; {cpu_note}",
                )
            )
    if problem is not None:
        rows.append(Row("verify", "docker", "skipped", note=problem))
    ctx.results["verify"] = figures
    return rows
