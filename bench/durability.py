"""What a crash costs: SIGKILLs of a session actor and of the driver's process group at random moments of a
run with stragglers, each followed by ``--resume``, counted against the simulator's request log.

The simulator runs on its own (``--base-url``), outside the killed process group, so its log holds every
request of both runs. Per round: prompts with stragglers (``sim.slow_rate`` 5%, 50x slower), 2 actors x 8
sessions; one session actor SIGKILLed once a random share of the run is recorded, then the driver's whole
process group at a later random moment; then ``raygen run --resume`` to the end.

Figures, summed over the rounds (a session = one prompt's attempt; "finished" = its final answer was sent):
  re-sent / in flight   sessions the resume sent to the model again, over the sessions sent but not
                        finished at the driver's kill: 1.0 plus the finished-but-not-yet-durable ones
  finished, re-sent     sessions re-sent although their final answer was out before the kill: only those
                        that finished in the last ``durable_within_s`` may be (the "late" column must be 0)
  actor kill re-sent    sessions run twice within the first run (the killed actor's in flight), at most
                        its 8 session slots
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import KEY_ENV, Context, Row, Sim, child_env, read_request_log, write_prompts
from raygen.config import SimConfig

DURABLE_WITHIN_S = 1.0
SLOTS = 8


def run(ctx: Context) -> list[Row]:
    rounds, prompts = (2, 48) if ctx.quick else (6, 160)
    rng = random.Random(int(os.environ.get("RAYGEN_BENCH_SEED", "10")))
    work = ctx.dir("durability")
    totals: collections.Counter[str] = collections.Counter()
    per_round = []
    for i in range(rounds):
        figures = _round(work / f"round{i}", prompts, rng, ctx.log)
        ctx.log(f"durability round {i}: {figures}")
        per_round.append(figures)
        totals.update(figures)
    waits = _ray_data_waits(ctx.log)
    ctx.results["durability"] = {"rounds": per_round, "totals": dict(totals), "ray_data_waits": waits}
    in_flight = totals["in_flight"]
    ratio = totals["resent"] / in_flight if in_flight else float("nan")
    base = f"{rounds} rounds x {prompts} prompts, 5% stragglers (50x), 2 actors x {SLOTS}"
    return [
        Row(
            "durability",
            "driver SIGKILL: re-sent / in flight",
            f"{totals['resent']}/{in_flight} = {ratio:.2f}",
            "~1 (in flight + last 1 s)",
            None,
            f"{base}; {totals['recorded_at_kill']} recorded at the kills, none re-sent: "
            f"{totals['recorded_resent'] == 0}",
        ),
        Row(
            "durability",
            "finished before the kill, re-sent (late)",
            f"{totals['finished_resent']} ({totals['late']} late)",
            f"late = 0 (finished > {DURABLE_WITHIN_S:g} s before the kill)",
            totals["late"] == 0 and totals["recorded_resent"] == 0,
            "late: finished more than durable_within_s before the kill yet not on disk",
        ),
        Row(
            "durability",
            "actor SIGKILL: sessions run twice",
            str(totals["actor_resent"]),
            f"<= {SLOTS} per kill",
            all(r["actor_resent"] <= SLOTS for r in per_round),
            f"{totals['actor_kills']} actor kills; the killed actor's finished sessions were skipped",
        ),
        Row(
            "durability",
            "Ray Data output: a finished row's wait",
            f"{min(waits):.1f}-{max(waits):.1f} s" if waits else "n/a",
            "why records take the control actor",
            None,
            "bench/raydata_probe.py: an async map_batches UDF yields each row as it finishes; iter_batches "
            "gets them when the task's 20-s straggler ends",
        ),
        Row(
            "durability",
            "every prompt exactly once after --resume",
            str(totals["exact"] == rounds),
            "True",
            totals["exact"] == rounds,
        ),
    ]


def _ray_data_waits(log: Any) -> list[float]:
    """Seconds each non-straggler row of bench/raydata_probe.py waited between finishing and reaching the
    driver."""
    probe = subprocess.run(
        [sys.executable, "-m", "bench.raydata_probe"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
    )
    try:
        rows = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        log(f"durability: the Ray Data probe failed: {probe.stderr[-1500:]}")
        return []
    return [r["delivered"] - r["done"] for r in rows if r["id"] != 0]


def _round(work: Path, prompts: int, rng: random.Random, log: Any) -> dict[str, int]:
    work.mkdir(parents=True, exist_ok=True)
    dataset = write_prompts(work / "p.jsonl", prompts, tag=work.name)
    sim_log = work / "sim.jsonl"
    sim_cfg = SimConfig(latency_s=0.2, slow_rate=0.05, slow_factor=50.0, log_path=sim_log)
    config = {
        "model": {"type": "openai", "api_key_env": KEY_ENV},
        "ray": {"workers": 2, "sessions_per_worker": SLOTS},
        "env": {"type": "local", "root": str(work / "wd")},
        "output": {"output_dir": str(work / "runs"), "run_name": "r", "durable_within_s": DURABLE_WITHIN_S},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    run_dir = work / "runs" / "r"
    with Sim(sim_cfg) as sim:
        cmd = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "--config", str(work / "run.yaml")]
        cmd += ["--base-url", sim.url]
        out = (work / "run.log").open("w")
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )
        try:
            actor_kills = 0
            if _wait_recorded(run_dir, int(prompts * rng.uniform(0.1, 0.25)), proc):
                actors = _session_actors(proc.pid)
                if actors:
                    os.kill(rng.choice(actors), signal.SIGKILL)
                    actor_kills = 1
            # Late enough for Ray to restart the actor and re-run its task (seconds on a loaded machine).
            _wait_recorded(run_dir, int(prompts * rng.uniform(0.6, 0.85)), proc)
            time.sleep(rng.uniform(0, 2))
            killed_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            out.close()
        _wait_gone(proc.pid)
        recorded_at_kill = _recorded(run_dir)
        # Requests of the dead run still being answered (a straggler's take 10 s) belong to it; then the
        # log, flushed every second, holds all of them.
        deadline = time.monotonic() + 120
        while sim.stats().get("in_flight") and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.5)
        first = read_request_log(sim_log)
        resumed = subprocess.run(
            [*cmd, "--resume"], capture_output=True, text=True, env=child_env(), timeout=1800
        )
        if resumed.returncode != 0:
            log(f"durability: the resume failed ({resumed.returncode}): {resumed.stderr[-2000:]}")
    second = read_request_log(sim_log)[len(first) :]
    return _figures(first, second, recorded_at_kill, killed_at, run_dir, dataset, actor_kills)


def _figures(
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    recorded_at_kill: set[str],
    killed_at: float,
    run_dir: Path,
    dataset: Path,
    actor_kills: int,
) -> dict[str, int]:
    sent = {e["prompt_sha"] for e in first}
    finished_at: dict[str, float] = {}
    for e in first:  # the final answer: a 200 reply with no tool call, before the kill
        if e.get("status") == 200 and not e.get("tool_calls") and e["ts"] <= killed_at:
            finished_at[e["prompt_sha"]] = min(e["ts"], finished_at.get(e["prompt_sha"], e["ts"]))
    starts_first = collections.Counter(e["prompt_sha"] for e in first if e.get("turn") == 0)
    resent = {e["prompt_sha"] for e in second if e.get("turn") == 0} & sent
    recorded = {_sha(p) for p in recorded_at_kill}
    finished_resent = resent & set(finished_at)
    prompts = [json.loads(line)["prompt"] for line in dataset.read_text().splitlines() if line.strip()]
    return {
        "in_flight": len(sent - set(finished_at) - recorded),
        "resent": len(resent),
        "recorded_at_kill": len(recorded),
        "recorded_resent": len(resent & recorded),
        "finished_resent": len(finished_resent),
        "late": sum(finished_at[s] < killed_at - DURABLE_WITHIN_S for s in finished_resent),
        "actor_kills": actor_kills,
        "actor_resent": sum(n > 1 for n in starts_first.values()),
        "exact": int(sorted(_outputs(run_dir)) == sorted(prompts)),
    }


def _sha(prompt: str) -> str:
    """How the simulator's request log names a session: its first user message's hash."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _outputs(run_dir: Path) -> list[str]:
    """The first user message of every merged record (kept, rejected and failed)."""
    return [
        next(m["content"] for m in json.loads(line)["messages"] if m["role"] == "user")
        for folder in ("data", "rejected", "failed")
        for path in sorted((run_dir / folder).glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def _recorded(run_dir: Path) -> set[str]:
    """The first user message of every record in the final shards."""
    found = set()
    for path in (run_dir / "shards").glob("*.jsonl") if (run_dir / "shards").is_dir() else []:
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                found.add(next(m["content"] for m in record["messages"] if m["role"] == "user"))
    return found


def _wait_recorded(run_dir: Path, count: int, proc: subprocess.Popen, timeout_s: float = 900) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_recorded(run_dir)) >= count:
            return True
        time.sleep(0.2)
    return False


def _session_actors(sid: int) -> list[int]:
    return [pid for pid, cmdline in _session_processes(sid) if "SessionWorker" in cmdline]


def _session_processes(sid: int) -> list[tuple[int, str]]:
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            alive.append((int(entry.name), cmdline))
    return alive


def _wait_gone(sid: int, timeout_s: float = 60) -> None:
    """Ray's workers notice their raylet died and exit on their own; wait, then kill what is left."""
    deadline = time.monotonic() + timeout_s
    while _session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid, _ in _session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
