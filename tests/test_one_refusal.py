"""One bad answer never freezes the cluster (issue 24), ``raygen run`` end to end on Ray.

The provider answers one request with ``503`` and ``Retry-After: 100000`` (an overloaded replica, a
misconfigured gateway), under ``--rpm 600``, ``model.retry_max_wait_s: 3`` and ``session_timeout_s: 60``.
Before, the governor paused the whole cluster for ``governor.max_pause_s`` (120 s) and all 4 sessions
failed ``session_timeout``, the 3 healthy ones included. Now that answer delays only its own request (its
retry, within ``retry_max_wait_s``); the healthy sessions never wait for it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_runs import read_jsonl
from tests.hostile_provider import HostileProvider, answer, status

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RETRY_MAX_WAIT_S = 3.0


async def test_one_absurd_retry_after_delays_only_its_own_request(tmp_path: Path):
    script = {
        "refused once": [status(503, {"Retry-After": "100000"}), answer()],
        **{f"healthy {i}": [answer()] for i in range(3)},
    }
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"id": p, "prompt": p}) + "\n" for p in script))
    async with HostileProvider(script) as provider:
        config = {
            "model": {"type": "openai", "base_url": provider.url, "retry_max_wait_s": RETRY_MAX_WAIT_S},
            "session": {"session_timeout_s": 60},
            "ray": {"workers": 1, "sessions_per_worker": 4},
            "env": {"type": "fake"},
            "governor": {"rpm": 600},  # max_pause_s stays at its default, 120 s
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": "one-refusal"},
        }
        config_path = tmp_path / "run.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "-c", str(config_path)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env={**os.environ, "OPENAI_API_KEY": "sk-one-refusal"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), 300)
    run = tmp_path / "runs" / "one-refusal"
    records = {r["id"]: r for r in read_jsonl(run.glob("*/*.jsonl"))}
    assert set(records) == set(script), stderr.decode()[-3000:]
    for name, record in records.items():
        assert record["exit_status"] == "completed", (name, record["error"])
    durations = {name: r["timing"]["duration_s"] for name, r in records.items()}
    print(f"\nsession durations: {durations}")
    assert provider.per_prompt["refused once"] == 2  # refused, then retried once
    # The refused request waited its own retry (the Retry-After, capped at retry_max_wait_s) ...
    assert RETRY_MAX_WAIT_S * 0.9 <= durations["refused once"] < RETRY_MAX_WAIT_S + 10
    # ... and nobody else waited for it: no cluster pause.
    assert all(durations[f"healthy {i}"] < RETRY_MAX_WAIT_S for i in range(3)), durations
    governor = json.loads((run / "statistics.json").read_text())["this_invocation"]["governor"]["snapshot"]
    assert governor["pauses"] == 0 and governor["errors"] == 1
