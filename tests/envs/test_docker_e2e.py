"""`raygen run --env docker` end to end: per-row images, a missing image failing without any model call,
and no container left behind."""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

import pytest
from cli_runs import run_records, run_with_config, write_dataset
from test_docker_engine import docker_skip_reason

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow]

MISSING = "raygen-test/does-not-exist:1"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_run_with_per_row_images(tmp_path: Path):
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    import docker

    rows = []
    for i in range(4):
        rows.append(
            {"id": f"bb-{i}", "prompt": f"busybox task {i}: list the files", "image": "raygen-test/busybox"}
        )
        rows.append(
            {"id": f"py-{i}", "prompt": f"python task {i}: print 2**10", "image": "raygen-test/python"}
        )
    rows.append({"id": "gone-0", "prompt": "this image does not exist", "image": MISSING})
    rows.append({"id": "gone-1", "prompt": "neither does this one", "image": MISSING})
    dataset = write_dataset(tmp_path / "prompts.jsonl", rows)
    log = tmp_path / "sim.jsonl"
    config = {
        "sim": {"latency_s": 0.01, "log_path": str(log)},
        "env": {"type": "docker", "pull": "never"},
        "ray": {"workers": 2, "sessions_per_worker": 4},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "docker-e2e"},
    }
    proc = run_with_config(dataset, config, tmp_path / "run.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = run_records(tmp_path / "runs" / "docker-e2e")
    kept, failed, rejected = records["kept"], records["failed"], records["rejected"]

    assert sorted(r["id"] for r in failed) == ["gone-0", "gone-1"]
    for r in failed:
        assert r["exit_status"] == "error:image_unavailable" and MISSING in r["error"]
        assert r["api_calls"] == 0
    assert len(kept) + len(rejected) == 8
    for r in kept:
        assert r["env"]["backend"] == "docker" and r["env"]["image"] in (
            "raygen-test/busybox",
            "raygen-test/python",
        )
        assert "terminal=ok file=ok" in r["messages"][-1]["content"]  # the shell and files really worked

    # no model call was made for the rows whose image was missing
    requests = collections.Counter(json.loads(x)["prompt_sha"] for x in log.read_text().splitlines())
    for row in rows:
        assert (requests[sha(row["prompt"])] > 0) == (row["image"] != MISSING), row["id"]

    client = docker.from_env()
    leftovers = client.containers.list(all=True, filters={"label": "raygen.run=docker-e2e"})
    assert leftovers == []
