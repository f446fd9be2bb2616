"""``raygen run`` end to end on Ray against a hostile provider (tests/hostile_provider.py): each prompt
meets one misbehaviour of issue 15 and ends with the documented status and counts (docs/hostile.md)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.cli_runs import read_jsonl
from tests.envs.test_local_detached import pids_running
from tests.hostile_provider import (
    HostileProvider,
    answer,
    huge_reply,
    raw_body,
    status,
    tool_call,
    trickle,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]
FAST_RETRIES = {"max_retries": 2, "retry_max_wait_s": 0.05}


async def test_a_run_against_a_hostile_provider(tmp_path: Path):
    daemon = f"1002.{uuid.uuid4().int % 10**9}"
    script = {
        "malformed": [raw_body(b'{"choices": [')],
        "non-utf8": [raw_body(b"\xff\xfe{}")],
        "huge command": [tool_call("terminal", {"command": "echo " + "x" * 200_000}), answer("gave up")],
        "daemon": [tool_call("terminal", {"command": f"cd / && setsid nohup sleep {daemon} &"}), answer()],
        "fine": [answer()],
        # Under --rpm, one absurd Retry-After must not freeze the worker: its gate pauses at most
        # governor.max_pause_s (2 s here), so the run ends in seconds, not in 100000.
        "retry-after": [status(503, {"Retry-After": "100000"}), answer()],
        "trickle": [trickle(interval_s=1.0)],  # one byte a second: cut at model.timeout_s (3 s)
        "huge reply": [huge_reply(2_000_000)],
    }
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(f'{{"id": "{p}", "prompt": "{p}"}}\n' for p in script))
    async with HostileProvider(script) as provider:
        config = {
            "model": {"type": "openai", "base_url": provider.url, "timeout_s": 3, **FAST_RETRIES},
            "retry": {"max_attempts": 1},
            "session": {"max_reply_chars": 1_000_000},
            "ray": {"workers": 1, "sessions_per_worker": 8},
            "env": {"type": "local", "root": str(tmp_path / "workdirs")},
            "governor": {"rpm": 600, "max_pause_s": 2},
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": "hostile"},
        }
        config_path = tmp_path / "run.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "-c", str(config_path)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env={**os.environ, "OPENAI_API_KEY": "sk-hostile"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), 300)
    run = tmp_path / "runs" / "hostile"
    records = {r["id"]: r for r in read_jsonl(run.glob("*/*.jsonl"))}  # kept, rejected (no reasoning), failed
    assert set(records) == set(script), stderr.decode()[-3000:]
    for bad in ("malformed", "non-utf8"):
        assert records[bad]["exit_status"] == "error:provider_malformed"  # not error:internal
        assert records[bad]["api_calls"] == 1 and provider.per_prompt[bad] == 3  # one call, three attempts
    assert records["trickle"]["exit_status"] == "error:provider_unavailable"
    assert records["trickle"]["api_calls"] == 1 and "timeout_s=3" in records["trickle"]["error"]
    assert records["huge reply"]["exit_status"] == "error:reply_too_large"
    assert records["huge command"]["exit_status"] == "completed"  # not error:env_lost
    assert records["huge command"]["tool_error_counts"] == {"invalid_arguments": 1}
    for good in ("daemon", "fine", "retry-after"):
        assert records[good]["exit_status"] == "completed", records[good]["error"]
    assert pids_running(daemon) == []  # the daemon ended with its session


def test_round_two_a_non_ascii_run_name_warnings_and_folder_commands_during_a_run(tmp_path: Path):
    """Issue 28, end to end: ``--run-name ü40`` (case 1: every actor's metrics flush raised, samples ended
    ``error:worker_lost`` and were sent to the model again), a notice printed as rich's repr (case 11),
    and ``raygen merge`` / ``raygen rescore`` on the folder while the driver runs (they took no lock)."""
    from tests.resume_harness import (
        finish,
        live_session_processes,
        run_cli,
        session_starts,
        shard_records,
        sim_log_from,
        start_group,
        wait_for,
    )

    prompts = [f"Task {i}: list the files in the working directory." for i in range(11)]
    rows = [{"prompt": p} for p in prompts] + [{"prompt": prompts[0]}]  # line 12 repeats line 1: a notice
    dataset = tmp_path / "p.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "sim": {"latency_s": 1.0, "log_path": str(tmp_path / "sim.jsonl")},
        "ray": {"workers": 2, "sessions_per_worker": 2},
        "env": {"type": "local", "root": str(tmp_path / "wd")},
        "output": {"output_dir": str(tmp_path / "runs")},
        "filters": {"no_reasoning": False, "hallucinated_tools": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "runs" / "ü40"
    proc = start_group(
        ["run", str(dataset), "-c", str(tmp_path / "run.yaml"), "--run-name", "ü40"], tmp_path / "out.log"
    )
    try:
        assert wait_for(lambda: len(shard_records(run_dir)) >= 1, 400, proc), "no session finished"
        refusals = [run_cli(command, str(run_dir), timeout=120) for command in ("merge", "rescore")]
        running_meanwhile = proc.poll() is None
        proc.wait(timeout=600)
        ended = wait_for(lambda: not live_session_processes(proc.pid), 30)
    finally:
        out_log = finish(proc, tmp_path / "out.log")
    assert proc.returncode == 0, out_log[-4000:]
    for done in refusals:
        assert done.returncode == 2, done.stderr[-2000:]
        error = " ".join(done.stderr.split())
        assert f"is in use by another raygen driver: host {socket.gethostname()} pid {proc.pid}" in error
        assert "Traceback" not in done.stderr
    assert running_meanwhile, "the run ended before merge and rescore were tried"
    assert "Traceback" not in out_log and "UnicodeEncodeError" not in out_log, out_log[-6000:]
    assert "Notice(" not in out_log
    assert f"warning: {dataset}:12: prompt: same prompt as line 1; kept as a separate sample" in out_log
    records = [
        r for folder in ("data", "rejected", "failed") for r in read_jsonl(run_dir.glob(f"{folder}/*.jsonl"))
    ]
    assert len(records) == len(rows) and all(r["exit_status"] == "completed" for r in records)
    starts = session_starts(sim_log_from(tmp_path / "sim.jsonl", 0))
    assert sum(starts.values()) == len(rows)  # nothing sent to the model twice
    assert ended, live_session_processes(proc.pid)
