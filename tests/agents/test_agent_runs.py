"""Real harnesses from PyPI as the sessions of whole runs: CLI -> Ray -> session actors -> harness in the
session's sandbox -> raygen's proxy -> the simulator over HTTP -> shards -> merge. Hermes Agent on the bare
local backend with a real API key in the driver's and workers' environment (never in the harness's),
mini-swe-agent under bubblewrap (no network at all) and in a Docker container."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import read_jsonl, write_dataset
from conftest import AGENTS, HERMES, MINI, need

from raygen.config import SimConfig
from raygen.sim.launch import start_subprocess

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = [
    {"id": "files", "prompt": "List the files in the working directory.", "category": "bash"},
    {"id": "count", "prompt": "Count the lines of every text file here.", "category": "bash"},
    {"id": "sum", "prompt": "Compute 6*7 with the shell.", "category": "math"},
]
REAL_KEY = "sk-raygen-e2e-real-key-5f1c0a9e7d"


def raygen(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raygen.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )


def records(run: Path) -> dict[str, list[dict]]:
    return {part: read_jsonl(run.glob(f"{part}/*.jsonl")) for part in ("data", "rejected", "failed")}


def test_hermes_agent_run_with_the_real_key_kept_out_of_its_environment(tmp_path):
    need(HERMES)
    dataset = write_dataset(tmp_path / "prompts.jsonl", ROWS)
    sim = start_subprocess(SimConfig(latency_s=0.01, hallucinate_rate=0, no_reasoning_rate=0, seed=3))
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    # BASH_ENV: the shell in front of the unmodified harness first writes the environment it was given.
    hook = tmp_path / "dump-env.sh"
    hook.write_text(f'[ -n "$RAYGEN_SESSION_ID" ] && env > {dumps}/"$RAYGEN_SESSION_ID.$$".env\n')
    try:
        proc = raygen(
            "run", str(dataset), "--agent", "hermes", "--base-url", sim.url,
            "--api-key-env", "RAYGEN_E2E_KEY", "--model", "sim-model",
            "--workers", "1", "--sessions-per-worker", "3", "--output-dir", str(tmp_path / "runs"),
            "--run-name", "hermes", "-c", f"agent.executable={HERMES}",
            "-c", f"agent.env={{BASH_ENV: {hook}}}", "-c", "session.session_timeout_s=300",
            env={"RAYGEN_E2E_KEY": REAL_KEY},
        )  # fmt: skip
    finally:
        sim.stop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "runs" / "hermes"
    out = records(run)
    assert len(out["data"]) == 3 and not out["failed"], (out["failed"], proc.stderr[-3000:])
    for record in out["data"]:
        assert record["exit_status"] == "completed" and record["agent"]["type"] == "hermes"
        assert record["agent"]["exit_code"] == 0 and record["api_calls"] == 3
        assert "RAYGEN-VERIFY terminal=ok file=ok" in record["messages"][-1]["content"]
        assert {"terminal", "memory", "delegate_task"} <= set(record["tools_offered"])
        assert record["threads"] == [{"calls": [0, 1, 2], "main": True, "messages": []}]
    # One per shell: the harness's own, and those of Hermes's terminal tool (which drops the API variables).
    seen = {path.name: path.read_text() for path in dumps.glob("*.env")}
    assert all(REAL_KEY not in environment for environment in seen.values())
    harness = {n.split(".")[0] for n, e in seen.items() if "OPENAI_BASE_URL=http://127.0.0.1:" in e}
    assert len(harness) == 3  # every session's harness was looked at
    tokens = {line for e in seen.values() for line in e.splitlines() if line.startswith("OPENAI_API_KEY=")}
    assert len(tokens) == 3  # its own token each
    assert REAL_KEY not in (run / "manifest.json").read_text()
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["counts"]["kept"] == 3 and stats["api_calls"]["total"] == 9  # the proxy's calls, counted


def test_mini_swe_agent_run_under_bubblewrap_and_resume(tmp_path):
    need(MINI)
    dataset = write_dataset(tmp_path / "prompts.jsonl", ROWS)
    args = [
        "run", str(dataset), "--agent", "mini-swe-agent", "--bwrap", "--workers", "2",
        "--output-dir", str(tmp_path / "runs"), "--run-name", "mini",
        "-c", f"agent.executable={MINI}", "-c", f"env.bwrap_ro_binds=[{AGENTS}]",
    ]  # fmt: skip
    proc = raygen(*args)  # the built-in simulator: no --base-url
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "runs" / "mini"
    out = records(run)
    assert len(out["data"]) == 3 and not out["failed"], (out["failed"], proc.stderr[-3000:])
    for record in out["data"]:
        assert record["exit_status"] == "completed" and record["tools_offered"] == ["bash"]
        assert "RAYGEN-VERIFY terminal=ok" in record["messages"][-1]["content"]
        assert record["agent"]["exit_code"] == 0 and record["env"]["backend"] == "local"
    again = raygen(*args, "--resume")  # exactly once: nothing left to run
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to run" in again.stderr
    assert len(records(run)["data"]) == 3


@pytest.mark.docker
def test_mini_swe_agent_run_in_docker_containers_without_network(tmp_path):
    need(MINI)
    if not os.environ.get("DOCKER_HOST"):
        pytest.skip("no Docker engine (DOCKER_HOST)")
    dataset = write_dataset(tmp_path / "prompts.jsonl", ROWS[:2])
    proc = raygen(
        "run", str(dataset), "--agent", "mini-swe-agent", "--env", "docker", "--workers", "1",
        "--output-dir", str(tmp_path / "runs"), "--run-name", "docker",
        "-c", f"agent.executable={MINI}", "-c", "env.default_image=raygen-test/python",
        "-c", f"env.mounts=['{AGENTS}:{AGENTS}:ro']",  # the venv, at its path: Debian's python3 runs it
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = records(tmp_path / "runs" / "docker")
    assert len(out["data"]) == 2 and not out["failed"], (out["failed"], proc.stderr[-3000:])
    for record in out["data"]:
        assert record["env"]["backend"] == "docker" and record["exit_status"] == "completed"
        assert "RAYGEN-VERIFY terminal=ok" in record["messages"][-1]["content"]
