"""``hermes``: Hermes Agent run by raygen (``--agent hermes``) against Hermes's own ``batch_runner.py``,
side by side on the same prompts and simulator (issue 23).

Both run the same installed ``hermes-agent`` (``.ci/agents-setup.sh``) with N sessions in flight (16;
``--quick``: 8) on N distinct prompts against one simulator (200 ms per call, reasoning, no hallucinated
tools): raygen with one session actor holding N sessions, each Hermes a process in its own workdir behind
raygen's proxy; ``batch_runner.py`` with ``--num_workers N --batch_size 1`` (a process pool running Hermes's
``AIAgent`` in-process, all in one working directory). Figures: sessions/s over the whole command (raygen's
includes starting Ray and merging) and, for raygen, from the first session's start to the last's end; CPU
seconds per session of each command's whole process tree (``bench/procs.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.common import (
    KEY_VALUE,
    Context,
    Row,
    Sim,
    child_env,
    run_measured,
    run_raygen,
    tail,
    write_prompts,
)
from raygen.config import SimConfig

AGENTS = Path(os.environ.get("RAYGEN_AGENTS_DIR", "/tmp/raygen-ci/agents"))
HERMES = AGENTS / "hermes" / "bin" / "hermes"
BATCH_RUNNER = AGENTS / "hermes" / "lib" / "python3.11" / "site-packages" / "batch_runner.py"
MODEL = "sim-model"


def _batch_runner(ctx: Context, dataset: Path, sessions: int, base_url: str) -> tuple[float, float, int]:
    """(wall s, CPU s of the tree, sessions that ended with an answer) of one batch_runner.py run."""
    work = ctx.dir("hermes-batch-runner")
    cmd = [str(HERMES.parent / "python"), str(BATCH_RUNNER), f"--dataset_file={dataset}", "--batch_size=1"]
    cmd += ["--run_name=bench", f"--model={MODEL}", f"--api_key={KEY_VALUE}", f"--base_url={base_url}"]
    cmd += [f"--num_workers={sessions}", "--max_turns=10"]
    env = child_env({"HOME": str(work)})
    measured = run_measured(cmd, work / "runner.log", timeout_s=900, env=env, cwd=work)
    out = work / "data" / "bench" / "trajectories.jsonl"
    if measured.returncode != 0 or not out.exists():
        raise RuntimeError(f"batch_runner.py exited {measured.returncode}:\n{tail(measured.log_path)}")
    completed = sum('"completed": true' in line for line in out.read_text().splitlines())
    return measured.wall_s, measured.sampler.cpu_s, completed


def _top(cpu_by_name: dict[str, float], count: int = 6) -> str:
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in list(cpu_by_name.items())[:count])


def run(ctx: Context) -> list[Row]:
    if not HERMES.exists() or not BATCH_RUNNER.exists():
        return [Row("hermes", "skipped", "-", note=f"{HERMES} missing: .ci/agents-setup.sh")]
    sessions = 8 if ctx.quick else 16
    dataset = write_prompts(ctx.dir("hermes") / "prompts.jsonl", sessions, tag="hermes")
    sim_config = SimConfig(latency_s=0.2, hallucinate_rate=0.0, no_reasoning_rate=0.0, seed=5)
    with Sim(sim_config) as sim:
        config = {
            "agent": {"type": "hermes", "executable": str(HERMES)},
            "model": {"model": MODEL},
            "ray": {"workers": 1, "sessions_per_worker": sessions},
            "session": {"session_timeout_s": 600},
        }
        ours = run_raygen(ctx, "hermes-raygen", dataset, config, base_url=sim.url, timeout_s=900)
        sim.reset()
        wall, cpu, completed = _batch_runner(ctx, dataset, sessions, sim.url)
    kept = ours.statistics.get("counts", {}).get("kept", 0)
    ours_cpu = ours.measured.sampler.cpu_s
    ctx.results["hermes"] = {
        "sessions": sessions,
        "raygen": {"wall_s": ours.measured.wall_s, "cpu_s": ours_cpu, "kept": kept, "rate": ours.times.rate},
        "batch_runner": {"wall_s": wall, "cpu_s": cpu, "completed": completed},
    }
    note = f"{sessions} sessions, {sessions} in flight, simulator 200 ms/call"
    ours_rate = f"{sessions / ours.measured.wall_s:.3f}"
    return [
        Row("hermes", "raygen --agent hermes: sessions/s (whole command)", ours_rate,
            note=f"{note}; {kept} kept; {ours.times.rate:.3f}/s first start to last end"),
        Row("hermes", "batch_runner.py: sessions/s (whole command)", f"{sessions / wall:.3f}",
            note=f"{note}; {completed} completed"),
        Row("hermes", "raygen --agent hermes: CPU s/session", f"{ours_cpu / sessions:.2f}",
            note=f"whole tree, CPU s by process: {_top(ours.measured.sampler.cpu_by_name())}"),
        Row("hermes", "batch_runner.py: CPU s/session", f"{cpu / sessions:.2f}", note="whole tree: the pool"),
    ]  # fmt: skip
