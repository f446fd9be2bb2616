"""Worker deaths mid-run (docs/resume.md, "What a crash costs"): a session actor SIGKILLed while its
sessions are in flight, and a sample that kills every actor it runs on.

Both drive ``raygen run`` from the command line (its own process group) against the simulator and check
the output, the shards and the simulator's request log. The driver's own SIGKILL is exercised by the
randomized test in tests/test_resume.py.
"""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from resume_harness import (
    assert_each_prompt_once,
    finish,
    first_prompt,
    prompt_sha,
    session_actors,
    session_starts,
    shard_records,
    sim_log_from,
    start_group,
    wait_for,
    write_dataset,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _setup(tmp: Path, rows: list[dict[str, Any]], latency_s: float) -> list[str]:
    write_dataset(tmp / "p.jsonl", rows)
    config = {
        "sim": {"latency_s": latency_s, "log_path": str(tmp / "sim.jsonl")},
        "ray": {"workers": 2, "sessions_per_worker": 8},
        "env": {"type": "local", "root": str(tmp / "wd")},
        "output": {"output_dir": str(tmp / "runs"), "run_name": "r", "shard_max_records": 4},
        "retry": {"pass_delay_s": 0.1},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    return ["run", str(tmp / "p.jsonl"), "--config", str(tmp / "run.yaml")]


def test_killed_session_actor_is_restarted_and_its_sessions_run_again(tmp_path):
    rows = [{"prompt": f"Task {i}: list the files in the working directory."} for i in range(40)]
    args = _setup(tmp_path, rows, latency_s=0.3)
    sim_log = tmp_path / "sim.jsonl"
    proc = start_group(args, tmp_path / "out.log")
    try:
        # The log is flushed every second: lines mean sessions are talking to the model right now.
        busy = wait_for(lambda: sim_log.exists() and sim_log.stat().st_size > 3000, 400, proc)
        actors = session_actors(proc.pid)
        assert busy and actors, "the run never reached its sessions"
        recorded_at_kill = {r["sample_key"] for r in shard_records(tmp_path / "runs" / "r")}
        for pid in actors:  # every session actor: whichever holds sessions loses them
            os.kill(pid, signal.SIGKILL)
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert proc.returncode == 0, out_log[-3000:]
    run_dir = tmp_path / "runs" / "r"
    assert_each_prompt_once(run_dir, rows, out_log)
    records = shard_records(run_dir)
    # Ray restarted the actors and re-ran their tasks: one record per sample, all first attempts.
    assert sorted(r["sample_key"] for r in records) == sorted({r["sample_key"] for r in records})
    assert {r["attempt"] for r in records} == {1}
    starts = session_starts(sim_log_from(sim_log, 0))
    assert set(starts) == {prompt_sha(r["prompt"]) for r in rows}
    rerun = sum(starts.values()) - len(rows)
    print(f"killed {len(actors)} actor(s); {len(recorded_at_kill)} recorded before; {rerun} sessions re-run")
    assert rerun > 0  # the sessions in flight on the killed actors ran again
    recorded_shas = {prompt_sha(first_prompt(r)) for r in records if r["sample_key"] in recorded_at_kill}
    assert all(starts[sha] == 1 for sha in recorded_shas)  # recorded sessions were never re-sent


def test_sample_that_kills_its_worker_is_recorded_worker_lost_and_retried_alone(tmp_path):
    # bash sources BASH_ENV before every command of the poisoned row: it kills the session actor running
    # it on its first three runs. Ray re-runs the task twice, then gives up on it.
    counter = tmp_path / "kills"
    poison = tmp_path / "poison.sh"
    # The actor: the shell's nearest ancestor running SessionWorker (commands run under a subreaper).
    poison.write_text(
        "p=$PPID\n"
        'while [ "$p" -gt 1 ] && ! grep -q SessionWorker "/proc/$p/cmdline" 2>/dev/null; do\n'
        '    p=$(cut -d" " -f4 "/proc/$p/stat" 2>/dev/null || echo 1)\n'
        "done\n"
        f'n=$(cat {counter} 2>/dev/null || echo 0)\nif [ "$n" -lt 3 ] && [ "$p" -gt 1 ]; then '
        f'echo $((n + 1)) > {counter}; kill -9 "$p"; fi\n'
    )
    rows = [{"prompt": f"Task {i}: list the files in the working directory."} for i in range(11)]
    bad = {"prompt": "Task X: list the files.", "env": {"BASH_ENV": str(poison)}, "toolsets": ["terminal"]}
    rows.insert(4, bad)
    proc = start_group(_setup(tmp_path, rows, latency_s=0.05), tmp_path / "out.log")
    out_log = finish(proc, tmp_path / "out.log")
    assert proc.returncode == 0, out_log[-3000:]
    assert counter.read_text().strip() == "3"
    assert "pass 2: retrying" in out_log
    run_dir = tmp_path / "runs" / "r"
    assert_each_prompt_once(run_dir, rows, out_log)
    lost = [r for r in shard_records(run_dir) if r["exit_status"] == "error:worker_lost"]
    assert lost, "no sample was recorded as worker_lost"
    keys = collections.defaultdict(list)
    for record in shard_records(run_dir):
        keys[record["sample_key"]].append((record["attempt"], record["exit_status"]))
    for record in lost:  # every lost sample ran again, as its next attempt, and finished
        tries = sorted(keys[record["sample_key"]])
        assert tries[0] == (1, "error:worker_lost") and len(tries) == 2, tries
        assert not tries[1][1].startswith("error:") and tries[1][0] == 2, tries
    poison_key = next(r["sample_key"] for r in shard_records(run_dir) if first_prompt(r) == bad["prompt"])
    assert poison_key in {r["sample_key"] for r in lost}
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["failed"] == {} and stats["counts"]["total"] == len(rows)
