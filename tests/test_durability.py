"""Finished means safe (docs/resume.md, "What a crash costs"): a session's record is durable within a
second of its end whatever the other sessions do, a killed actor costs only its sessions in flight, and
SIGTERM / SIGINT / SIGUSR1 drain the run and exit 75, a second signal at once.

Everything drives ``raygen run`` from the command line (its own process group) against the simulator,
and checks the shard files, the output and the simulator's request log (tests/resume_harness.py).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_harness import (
    assert_each_prompt_once,
    finish,
    first_prompt,
    live_session_processes,
    prompt_sha,
    read_outputs,
    run_cli,
    session_actors,
    session_starts,
    shard_records,
    sim_log_from,
    start_group,
    status_table,
    wait_for,
    write_dataset,
)

from raygen.config import SimConfig
from raygen.model.sim_policy import is_slow
from raygen.run.drain import EXIT_RESUMABLE

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SLOW = {"slow_rate": 0.2, "slow_factor": 100.0}


def _prompts(n_fast: int, n_slow: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows with ``n_fast`` ordinary prompts and ``n_slow`` stragglers (the simulator's ``slow_rate``
    picks them per prompt), stragglers first; and the stragglers' prompts."""
    cfg = SimConfig(**SLOW)
    fast, slow = [], []
    i = 0
    while len(fast) < n_fast or len(slow) < n_slow:
        prompt = f"Task {i}: list the files in the working directory."
        (slow if is_slow(prompt, cfg) else fast).append(prompt)
        i += 1
    chosen = slow[:n_slow] + fast[:n_fast]
    return [{"prompt": p} for p in chosen], slow[:n_slow]


def _setup(
    tmp: Path, rows: list[dict[str, Any]], *, latency_s: float, workers: int, slots: int, **extra
) -> list[str]:
    write_dataset(tmp / "p.jsonl", rows)
    config = {
        "sim": {"latency_s": latency_s, "log_path": str(tmp / "sim.jsonl"), **extra.pop("sim", {})},
        "ray": {"workers": workers, "sessions_per_worker": slots},
        "env": {"type": "local", "root": str(tmp / "wd")},
        "output": {"output_dir": str(tmp / "runs"), "run_name": "r"},
        "retry": {"pass_delay_s": 0.1, **extra.pop("retry", {})},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    return ["run", str(tmp / "p.jsonl"), "--config", str(tmp / "run.yaml")]


def _recorded_prompts(run_dir: Path) -> set[str]:
    return {first_prompt(r) for r in shard_records(run_dir)}


def test_a_straggler_holds_back_no_other_record(tmp_path):
    # One actor, one Ray task: the straggler's batch-mates and task-mates must not wait for it.
    rows, (straggler,) = _prompts(n_fast=7, n_slow=1)
    proc = start_group(
        _setup(tmp_path, rows, latency_s=0.1, workers=1, slots=8, sim=SLOW), tmp_path / "out.log"
    )
    run_dir = tmp_path / "runs" / "r"
    try:
        fast_done = wait_for(lambda: len(_recorded_prompts(run_dir)) >= 7, 400, proc)
        recorded = _recorded_prompts(run_dir)
        still_running = proc.poll() is None
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert fast_done and still_running, out_log[-3000:]
    assert straggler not in recorded  # the 7 others were durable while it still ran (100x slower)
    assert proc.returncode == 0, out_log[-3000:]
    assert_each_prompt_once(run_dir, rows, out_log)


def test_a_killed_actor_costs_only_its_sessions_in_flight(tmp_path):
    # One actor of 8 slots, 16 samples: the first task holds a straggler and 7 sessions that finish long
    # before it. Killing the actor makes Ray Data re-run that task; its finished sessions must be skipped.
    rows, _ = _prompts(n_fast=15, n_slow=1)
    proc = start_group(
        _setup(tmp_path, rows, latency_s=0.1, workers=1, slots=8, sim=SLOW), tmp_path / "out.log"
    )
    run_dir = tmp_path / "runs" / "r"
    sim_log = tmp_path / "sim.jsonl"
    try:
        busy = wait_for(lambda: len(_recorded_prompts(run_dir)) >= 7, 400, proc)
        actors = session_actors(proc.pid)
        assert busy and actors, "the run never reached its sessions"
        time.sleep(1.5)  # everything finished so far is durable now (output.durable_within_s = 1)
        recorded_at_kill = _recorded_prompts(run_dir)
        for pid in actors:
            os.kill(pid, signal.SIGKILL)
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert proc.returncode == 0, out_log[-3000:]
    assert_each_prompt_once(run_dir, rows, out_log)
    starts = session_starts(sim_log_from(sim_log, 0))
    resent = {sha for sha, n in starts.items() if n > 1}
    recorded_shas = {prompt_sha(p) for p in recorded_at_kill}
    print(f"{len(recorded_at_kill)} recorded at the kill; re-sent: {len(resent)}")
    assert not resent & recorded_shas  # finished sessions were not paid for twice
    assert len(resent) <= 8  # at most the actor's session slots were in flight


# How long a drain may take to reach the session actors on a loaded 2-core machine (the driver's poll is
# 0.2 s); without a drain, sessions of this test keep starting for several seconds after the signal.
_DRAIN_REACHES_ACTORS_S = 2.0


def _started(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timing"]["started_at"]).timestamp()


def _drain_run(tmp: Path, latency_s: float, drain_timeout_s: float, rows: int = 40):
    rows_ = [{"prompt": f"Task {i}: list the files in the working directory."} for i in range(rows)]
    args = _setup(
        tmp, rows_, latency_s=latency_s, workers=2, slots=4, retry={"drain_timeout_s": drain_timeout_s}
    )
    return rows_, args


@pytest.mark.parametrize(
    ("sig", "whole_group"),
    [(signal.SIGTERM, False), (signal.SIGUSR1, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGUSR1", "ctrl-c"],
)
def test_a_signal_drains_merges_and_exits_resumable(tmp_path, sig, whole_group):
    rows, args = _drain_run(tmp_path, latency_s=0.6, drain_timeout_s=120)
    run_dir = tmp_path / "runs" / "r"
    sim_log = tmp_path / "sim.jsonl"
    proc = start_group(args, tmp_path / "out.log")
    try:
        started = wait_for(lambda: len(shard_records(run_dir)) >= 1, 400, proc)
        at_signal = len(shard_records(run_dir))
        signalled_at = time.time()
        if whole_group:  # Ctrl-C in a terminal: the simulator and a local Ray get it too
            os.killpg(proc.pid, sig)
        else:  # the driver only, as Slurm's --signal=B: or Kubernetes would
            os.kill(proc.pid, sig)
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert started, out_log[-3000:]
    assert proc.returncode == EXIT_RESUMABLE, out_log[-3000:]
    assert "left for --resume" in out_log
    records = shard_records(run_dir)
    assert at_signal <= len(records) < len(rows), (at_signal, len(records))
    # No new session started after the signal. Counting records is no measure of that: sessions that ended
    # just before the signal become durable up to output.durable_within_s later. Their start times are: a
    # session may still begin while the drain reaches the actors (the driver polls every 0.2 s), none later.
    late = [r["id"] for r in records if _started(r) > signalled_at + _DRAIN_REACHES_ACTORS_S]
    assert not late, (signalled_at, [(r["id"], r["timing"]["started_at"]) for r in records])
    # Every session sent to the model finished and is durable: nothing in flight was thrown away.
    sent = set(session_starts(sim_log_from(sim_log, 0)))
    assert sent == {prompt_sha(first_prompt(r)) for r in records}
    # The merge ran: the output holds exactly what finished, and the rest is pending.
    out = read_outputs(run_dir)
    assert len(out["kept"]) + len(out["rejected"]) == len(records)
    assert status_table(run_dir)["pending"] == len(rows) - len(records)

    offset = sim_log.stat().st_size
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_each_prompt_once(run_dir, rows, resumed.stderr)
    again = session_starts(sim_log_from(sim_log, offset))
    assert not set(again) & sent and sum(again.values()) == len(rows) - len(records)


def test_a_second_signal_stops_at_once_keeping_what_finished(tmp_path):
    # Requests of 4 s: the sessions in flight would need well over 10 s to finish.
    rows, args = _drain_run(tmp_path, latency_s=4.0, drain_timeout_s=600, rows=24)
    run_dir = tmp_path / "runs" / "r"
    proc = start_group(args, tmp_path / "out.log")
    try:
        started = wait_for(lambda: len(shard_records(run_dir)) >= 1, 600, proc)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(1)
        os.kill(proc.pid, signal.SIGINT)
        stopped = wait_for(lambda: proc.poll() is not None, 60)
        # No process of the run is left (Ray's workers notice their raylet is gone within seconds).
        left = (
            []
            if wait_for(lambda: not live_session_processes(proc.pid), 30)
            else live_session_processes(proc.pid)
        )
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert started and stopped, out_log[-3000:]
    assert proc.returncode == EXIT_RESUMABLE, out_log[-3000:]
    # issue 28 case 7: two Ray tracebacks (Ray Data's stats thread, after Ray shut down) came first.
    assert "Traceback" not in out_log and "Exception in thread" not in out_log, out_log[-6000:]
    assert "SIGTERM handler is not set" not in out_log  # that is a new Ray starting in a dying thread
    assert left == [], left
    done = len(shard_records(run_dir))
    assert 1 <= done < len(rows)
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_each_prompt_once(run_dir, rows, resumed.stderr)
