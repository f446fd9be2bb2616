"""From the command line with ``--mcp-config servers.json``: CLI -> pre-flight -> Ray Data -> session
actors -> the simulator (which calls every offered MCP tool once) -> real MCP servers in each session's
local workdir -> shards -> merge, Hermes format included. No network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import read_jsonl, write_dataset

from tests.mcp.helpers import SCRIPTED, processes_inside

SECRET = "mcp-e2e-secret-" + "5" * 16
ROWS = [
    {"id": f"r{i}", "category": "mcp", "prompt": f"What time is it in city number {i}?"} for i in range(6)
]


def raygen(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MCP_E2E_SECRET": SECRET}
    return subprocess.run(
        [sys.executable, "-m", "raygen.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def servers_file(path: Path, servers: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


@pytest.mark.ray
@pytest.mark.slow
def test_run_with_mcp_config_calls_the_servers_in_every_session(tmp_path):
    dataset = write_dataset(tmp_path / "prompts.jsonl", ROWS)
    servers = servers_file(
        tmp_path / "servers.json",
        {
            "time": {
                "command": sys.executable,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                "env": {"UNUSED_TOKEN": "${MCP_E2E_SECRET}"},
            },
            "git": {"command": sys.executable, "args": ["-m", "mcp_server_git"]},
        },
    )
    root = tmp_path / "workdirs"
    root.mkdir()
    proc = raygen(
        "run", str(dataset), "--mcp-config", str(servers), "--run-name", "mcp", "--output-dir", str(tmp_path),
        "--workers", "2", "--sessions-per-worker", "4", "--format", "hermes", "--no-filter-reasoning",
        "-c", f"env.root={root}", "-c", "sim.hallucinate_rate=0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "mcp"
    kept = read_jsonl(run.glob("data/*.jsonl"))
    assert sorted(r["id"] for r in kept) == sorted(r["id"] for r in ROWS)
    for record in kept:
        assert [s["name"] for s in record["mcp_servers"]] == ["git", "time"]
        assert {"git", "time"} <= set(record["toolsets_used"])
        stats = record["tool_stats"]
        assert stats["time__get_current_time"] == {"count": 1, "success": 1, "failure": 0}, record["id"]
        assert stats["time__convert_time"]["success"] == 1
        assert stats["git__git_status"]["success"] == 1  # in the repository the probe made
        assert stats["terminal"]["success"] == 1  # the built-in tools ran beside them
        answers = [m["content"] for m in record["messages"] if m.get("name") == "time__get_current_time"]
        assert json.loads(answers[0])["timezone"] == "Europe/Berlin"
    statistics = json.loads((run / "statistics.json").read_text())
    assert statistics["tools"]["time__get_current_time"]["success"] == len(ROWS)
    hermes = (
        read_jsonl([run / "data" / "trajectories.jsonl"])
        if (run / "data" / "trajectories.jsonl").exists()
        else read_jsonl(run.glob("**/trajectories*.jsonl"))
    )
    assert len(hermes) == len(ROWS)
    assert all(
        "time" in h["toolsets_used"] and h["tool_stats"]["time__get_current_time"]["success"] == 1
        for h in hermes
    )
    manifest = (run / "manifest.json").read_text()
    assert json.loads(manifest)["generation"]["mcp_servers"]["time"]["placement"] == "session"
    for path in run.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path  # a ${VAR} value is a secret
    assert not list(root.iterdir()) and not processes_inside(root)  # workdirs and servers gone


def test_a_server_that_does_not_start_stops_the_run_in_one_line(tmp_path):
    dataset = write_dataset(tmp_path / "prompts.jsonl", ROWS[:1])
    servers = servers_file(
        tmp_path / "servers.json", {"broken": {"command": sys.executable, "args": [SCRIPTED, "crash-init"]}}
    )
    proc = raygen(
        "run", str(dataset), "--mcp-config", str(servers), "--run-name", "x", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "'broken'" in errors[0] and "missing configuration FOO" in errors[0]
    assert not (tmp_path / "x").exists()  # nothing started: no run folder, no model call


def test_validate_knows_the_servers_of_mcp_config_as_toolsets(tmp_path):
    dataset = write_dataset(tmp_path / "prompts.jsonl", [{"prompt": "p", "toolsets": ["terminal", "git"]}])
    servers = servers_file(tmp_path / "servers.json", {"git": {"command": "mcp-server-git"}})
    assert raygen("validate", str(dataset)).returncode == 1  # "git" is no toolset without the servers
    assert raygen("validate", str(dataset), "--mcp-config", str(servers)).returncode == 0
