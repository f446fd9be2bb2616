"""Under a 429 storm (a simulator with a hard limit far below demand, no governor), every prompt still
ends exactly once and no session is started twice: retries repeat requests, never sessions."""

from __future__ import annotations

import collections
import hashlib
import json

import pytest
from cli_runs import run_records, run_with_config, write_dataset

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_no_prompt_lost_or_duplicated_under_a_429_storm(tmp_path):
    rows = [{"id": f"p{i}", "prompt": f"storm task {i}: print {i} in the shell"} for i in range(30)]
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows)
    log = tmp_path / "sim.jsonl"
    config = {
        "sim": {"latency_s": 0.02, "rate_limit_rpm": 300, "rate_limit_burst": 1, "log_path": str(log)},
        "model": {"max_retries": 60, "retry_max_wait_s": 2},
        "governor": {"adaptive": False},  # no governor: the storm must reach the sessions
        "tools": {"distribution": "default"},
        "env": {"type": "fake"},
        "ray": {"workers": 2, "sessions_per_worker": 8},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "storm"},
    }
    proc = run_with_config(dataset, config, tmp_path / "run.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [r for group in run_records(tmp_path / "runs" / "storm").values() for r in group]
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in rows)  # each exactly once
    assert all(not r["exit_status"].startswith("error:") for r in records)

    entries = [json.loads(line) for line in log.read_text().splitlines()]
    statuses = collections.Counter(e["status"] for e in entries)
    assert statuses[429] >= len(rows)  # it really was a storm
    # exactly one accepted first turn per prompt: no session was started twice
    first_turns = collections.Counter(
        e["prompt_sha"] for e in entries if e["turn"] == 0 and e["status"] == 200
    )
    want = {hashlib.sha256(r["prompt"].encode()).hexdigest()[:16] for r in rows}
    assert set(first_turns) == want and set(first_turns.values()) == {1}
