"""The cluster's head dies mid-run (a node failure, an OOM kill, a cancelled Slurm job's steps): the
driver, a separate process joined with ``--ray-address``, says so in one line and exits resumable (75),
with what finished durable; a fresh head and ``--resume`` finish every prompt exactly once.

Before, the driver printed Ray's ActorUnavailableError traceback and took long enough to exit that a
cancelled Slurm job was SIGKILLed before its own cleanup ended (test_slurm's scancel test in CI).
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from cli_runs import read_jsonl
from ray_node import MARK_VARIABLE, free_port_block, kill_tagged, wait_unmarked

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "prompts.jsonl"
RAY_NODE = Path(__file__).with_name("ray_node.py")


def start_head(tmp: Path, port: int, env: dict) -> subprocess.Popen:
    """A single-node Ray head in its own process group (the test kills the group)."""
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
    argv += ["--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    argv += [f"--temp-dir={tmp / 'ray'}", f"--ray-client-server-port={port + 1}"]
    argv += [f"--dashboard-agent-listen-port={port + 2}", f"--dashboard-agent-grpc-port={port + 3}"]
    argv += [f"--metrics-export-port={port + 4}", f"--runtime-env-agent-port={port + 5}"]
    argv += [f"--min-worker-port={port + 10}", f"--max-worker-port={port + 60}"]
    log = (tmp / "head.log").open("a")
    head_env = {**env, HEAD_VARIABLE: env[MARK_VARIABLE]}
    head = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=head_env, start_new_session=True)
    wait = [sys.executable, str(RAY_NODE), "wait-nodes", f"127.0.0.1:{port}", "1", "120"]
    waited = subprocess.run(wait, capture_output=True, text=True, env=env, timeout=150)
    assert waited.returncode == 0, f"the head did not come up: {waited.stderr[-3000:]}"
    return head


HEAD_VARIABLE = "RAYGEN_TEST_HEAD"
"""Set (to the test's mark) in the head's environment only: its Ray workers inherit it, the driver not."""


def kill_head(proc: subprocess.Popen, mark: str) -> None:
    """SIGKILL the head: its group and every process carrying its variable (Ray workers run in their own
    process groups)."""
    kill_tagged(proc.pid, f"{HEAD_VARIABLE}={mark}")
    proc.wait(30)


@pytest.mark.timeout(600)
def test_a_head_lost_mid_run_exits_resumable_and_resume_finishes(tmp_path):
    tmp = Path(tempfile.mkdtemp(prefix="rghl-", dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
    port, mark = free_port_block(70), f"headlost-{uuid.uuid4().hex}"
    env = {**os.environ, MARK_VARIABLE: mark, "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # the drivers share it
    config = tmp_path / "run.yaml"
    run = tmp_path / "runs" / "lost"
    config.write_text(
        yaml.safe_dump(
            {
                "sim": {"latency_s": 1.0, "log_path": str(tmp_path / "sim.jsonl")},
                "env": {"type": "fake"},
                "ray": {"workers": 1, "sessions_per_worker": 4},
                "output": {"output_dir": str(tmp_path / "runs"), "run_name": "lost", "shard_flush_s": 0.3},
            }
        )
    )
    argv = [sys.executable, "-m", "raygen.cli", "run", str(EXAMPLES), "--config", str(config)]
    argv += ["--ray-address", f"127.0.0.1:{port}"]
    head, driver = start_head(tmp, port, env), None
    try:
        driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 300
        while not read_jsonl(run.glob("shards/*.jsonl")):
            assert driver.poll() is None, driver.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "no session finished in time"
            time.sleep(0.3)
        kill_head(head, mark)
        killed = time.monotonic()
        _, stderr = driver.communicate(timeout=120)
        took = time.monotonic() - killed
        done = read_jsonl(run.glob("shards/*.jsonl"))
        assert driver.returncode == 75, stderr[-4000:]
        assert "Traceback" not in stderr, stderr[-4000:]
        last = stderr.strip().splitlines()[-1]
        assert "control actor is gone" in last and "--resume" in last, stderr[-4000:]
        assert took < 60, f"the driver took {took:.0f} s to exit after the head died"
        rows = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
        assert 0 < len(done) < len(rows), "the head died after the run had ended: nothing was tested"

        head = start_head(tmp, port, env)
        resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        folders = ("data", "rejected", "failed")
        final = read_jsonl([path for folder in folders for path in run.glob(f"{folder}/*.jsonl")])
        assert collections.Counter(r["id"] for r in final) == collections.Counter(r["id"] for r in rows)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.communicate()
        if head.poll() is None:
            kill_head(head, mark)
        left = wait_unmarked(mark, 30)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"processes survived the test: {left}"


def test_a_head_that_is_not_there_is_a_one_line_error(tmp_path):
    """``--ray-address`` naming no running head: exit 2 before any session, one line, no traceback."""
    address = f"127.0.0.1:{free_port_block(1)}"
    argv = [sys.executable, "-m", "raygen.cli", "run", str(EXAMPLES), "--ray-address", address]
    argv += ["-c", f"output.output_dir={tmp_path / 'runs'}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"cannot join the Ray cluster at {address}: nothing accepted" in last
