"""The options people migrate with from Hermes Agent's batch_runner, through the CLI, against the simulator
over HTTP (its request log shows what was sent) on real Ray: --format hermes, reasoning and routing flags,
--stream, --prefill-messages, --ephemeral-system-prompt, docker_image rows, truncation, --retry-failed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runs import load_json_with_datasets, read_jsonl, run_records, write_dataset

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REFERENCE = Path(__file__).parent / "data" / "hermes-reference"
EPHEMERAL = "EPHEMERAL-GUIDANCE: answer tersely."
PREFILL = [{"role": "user", "content": "PREFILL-EXAMPLE: say hi"}, {"role": "assistant", "content": "hi"}]


def raygen(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "raygen.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


def setup_run(tmp: Path, rows: int = 4, **sim: Any) -> tuple[Path, Path, Path]:
    """A dataset of the reference's prompts (the first as ``docker_image``), and a config file."""
    prompts = [json.loads(line) for line in (REFERENCE / "basic" / "prompts.jsonl").read_text().splitlines()]
    data = [{"prompt": p["prompt"], "id": p["id"]} for p in prompts[:rows]]
    data[0]["docker_image"] = "python:3.11-slim"
    dataset = write_dataset(tmp / "prompts.jsonl", data)
    (tmp / "work").mkdir()
    config = {
        "sim": {"latency_s": 0.01, "reasoning_style": "field", "log_path": str(tmp / "sim.jsonl"), **sim},
        "ray": {"workers": 1, "sessions_per_worker": 4},
        "env": {"type": "local", "root": str(tmp / "work")},
        "output": {"output_dir": str(tmp / "runs")},
        "tools": {"distribution": "terminal_only"},
        "retry": {"pass_delay_s": 0},
    }
    config_path = tmp / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return dataset, config_path, tmp / "sim.jsonl"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("migrate")
    dataset, config, log = setup_run(tmp, provider_name="Upstream-Z")
    prefill = tmp / "prefill.json"
    prefill.write_text(json.dumps(PREFILL))
    proc = raygen(
        "run", dataset, "-c", config, "--run-name", "m", "--format", "hermes",
        "--reasoning-effort", "high", "--providers-order", "b,a", "--providers-ignored", "c",
        "--provider-sort", "price", "--stream", "--prefill-messages", prefill,
        "--ephemeral-system-prompt", EPHEMERAL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"tmp": tmp, "run": tmp / "runs" / "m", "log": read_jsonl([log])}


def test_hermes_file_loads_with_the_reference(migrated):
    trajectories = migrated["run"] / "trajectories.jsonl"
    records = read_jsonl([trajectories])
    assert len(records) == 4 and all(r["completed"] and not r["partial"] for r in records)
    reference = REFERENCE / "basic" / "trajectories.jsonl"
    for files in ((reference, trajectories), (trajectories, reference)):
        assert load_json_with_datasets(migrated["tmp"], *files).get("rows") == 14
    stats = json.loads((migrated["run"] / "statistics.json").read_text())
    ref_stats = json.loads((REFERENCE / "basic" / "statistics.json").read_text())
    assert (
        set(ref_stats) <= set(stats) and stats["run_name"] == "m" and stats["distribution"] == "terminal_only"
    )
    assert stats["tool_statistics"]["terminal"]["count"] == 4


def test_every_request_carried_the_options(migrated):
    requests = [entry for entry in migrated["log"] if entry["status"] == 200]
    # (the scripted policy reads the prefill's turns as its own history: more than 2 calls a session)
    assert len(requests) >= 8
    system_sha = hashlib.sha256(EPHEMERAL.encode()).hexdigest()[:16]
    for entry in requests:
        assert entry["options"]["stream"] is True
        assert entry["options"]["reasoning_effort"] == "high"  # a loopback endpoint: OpenAI's spelling
        assert entry["options"]["provider"] == {"ignore": ["c"], "order": ["b", "a"], "sort": "price"}
        assert entry["roles"][:4] == ["system", "user", "assistant", "user"]  # ephemeral, prefill, prompt
        assert entry["system_sha"] == system_sha


def test_sent_options_are_not_stored_and_the_provider_is(migrated):
    records = run_records(migrated["run"])["kept"]
    assert len(records) == 4
    for text in (json.dumps(records), (migrated["run"] / "trajectories.jsonl").read_text()):
        assert "EPHEMERAL-GUIDANCE" not in text and "PREFILL-EXAMPLE" not in text
    for record in records:
        assert len(record["turns"]) == record["api_calls"] >= 2
        assert {t["provider"] for t in record["turns"]} == {"Upstream-Z"}
        assert (
            record["turns"][0]["finish_reason"] == "tool_calls"
            and record["turns"][-1]["finish_reason"] == "stop"
        )
    images = sorted(r["env"]["image"] or "" for r in records)
    assert images == ["", "", "", "python:3.11-slim"]  # the docker_image row
    # issue 28 case 9: no file of the run folder holds the ephemeral system prompt (the manifest held it
    # twice); the manifest keeps its hash.
    holding = [
        p for p in migrated["run"].rglob("*") if p.is_file() and b"EPHEMERAL-GUIDANCE" in p.read_bytes()
    ]
    assert holding == []
    manifest = json.loads((migrated["run"] / "manifest.json").read_text())
    recorded = manifest["generation"]["ephemeral_system_prompt"]
    assert recorded["sha256"] == hashlib.sha256(EPHEMERAL.encode()).hexdigest()


def test_truncated_sessions_are_rejected_and_remerge_as_partial(tmp_path):
    dataset, config, log = setup_run(tmp_path)
    proc = raygen(
        "run", dataset, "-c", config, "--run-name", "t", "-c", "sampling.max_tokens=5", "--no-reasoning"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "runs" / "t"
    out = run_records(run)
    assert not out["kept"] and len(out["rejected"]) == 4
    assert {(r["exit_status"], r["rejection_reason"], r["completed"]) for r in out["rejected"]} == {
        ("truncated", "truncated", False)
    }
    assert all(e["options"]["reasoning_effort"] == "none" for e in read_jsonl([log]))
    assert json.loads((run / "statistics.json").read_text())["exit_statuses"] == {"truncated": 4}
    proc = raygen("merge", run, "--no-filter-truncated", "--no-filter-reasoning", "--format", "hermes")
    assert proc.returncode == 0, proc.stderr[-4000:]
    hermes = read_jsonl([run / "trajectories.jsonl"])
    assert len(hermes) == 4 and all(r["partial"] and not r["completed"] for r in hermes)
    assert raygen("merge", run, "--format", "xml").returncode != 0


def status(run: Path) -> dict[str, str]:
    proc = raygen("status", run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_retry_failed_repairs_a_run_after_the_model_name_is_fixed(tmp_path):
    dataset, config, _ = setup_run(tmp_path)
    base = ("run", dataset, "-c", config, "--run-name", "r")
    proc = raygen(*base, "--model", "nonexistent-model")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "runs" / "r"
    assert {r["exit_status"] for r in run_records(run)["failed"]} == {"error:provider_bad_request"}
    # A plain resume does nothing: the failures are final. Fixing the model needs --force.
    assert "0 to run" in raygen(*base, "--resume", "--model", "nonexistent-model").stderr
    refused = raygen(*base, "--resume", "--retry-failed", "provider_bad_request", "--model", "raygen-sim")
    assert refused.returncode != 0 and "generation config differs" in refused.stderr
    bad_kind = raygen(*base, "--resume", "--retry-failed", "provider_typo")
    assert bad_kind.returncode != 0 and "unknown failure kind 'provider_typo'" in bad_kind.stderr
    fixed = raygen(
        *base, "--resume", "--retry-failed", "provider_bad_request", "--model", "raygen-sim", "--force"
    )
    assert fixed.returncode == 0, fixed.stderr[-4000:]
    assert "4 failed samples run again" in fixed.stderr
    out = run_records(run)
    assert len(out["kept"]) == 4 and not out["failed"] and not out["rejected"]
    assert {r["attempt"] for r in out["kept"]} == {2}
    rows = status(run)
    assert rows["total"] == "4" and rows["kept"] == "4" and rows.get("pending", "0") == "0"
