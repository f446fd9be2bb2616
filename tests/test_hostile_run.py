"""``raygen run`` end to end on Ray against a hostile provider (tests/hostile_provider.py): each prompt
meets one misbehaviour of issue 15 and ends with the documented status and counts (docs/hostile.md)."""

from __future__ import annotations

import asyncio
import os
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
