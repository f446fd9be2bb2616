"""Run folders that outlive the node, from the command line: ``raygen run`` to ``s3://`` on a real
S3-compatible server (moto, loopback) with ``status``, ``merge``, ``report``, ``sample``, ``compare``,
``datasets.load_dataset``, a ``--resume`` after SIGKILL and a store that goes away mid-run; and one
driver per run (a second driver refused by name, a killed one taken over)."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from resume_harness import kill_group, prompt_sha, raygen_cmd, run_cli, start_group, stop_leftovers

pytest.importorskip("moto")

from s3_server import ACCESS_KEY, SECRET_KEY, MotoServer, Relay, client, environment, make_bucket, s3_env

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

BUCKET = "raygen-runs"
CATEGORIES = ("bash", "files", "python", "sql")


_VIEW: list = []
"""The tests' own boto3 client, straight to the server (not through the relay raygen uses)."""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    make_bucket(server.url, BUCKET)
    _VIEW[:] = [client(server.url)]
    relay = Relay(server.port)  # what raygen talks to: a test can cut it (store unreachable)
    with environment(s3_env(relay.url)):
        yield relay
    relay.close()
    server.stop()


def bucket_keys(prefix: str = "") -> list[str]:
    pages = _VIEW[0].get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def bucket_objects(prefix: str = "") -> dict[str, bytes]:
    """The objects of the bucket under ``prefix``, read with boto3 (independently of raygen and pyarrow)."""
    return {key: _VIEW[0].get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in bucket_keys(prefix)}


def rows(n: int, tag: str) -> list[dict]:
    return [
        {"id": f"{tag}-{i:03d}", "prompt": f"List the files here and count them ({tag} {i})", "category": c}
        for i, c in zip(range(n), (CATEGORIES * n)[:n], strict=True)
    ]


def setup_run(tmp: Path, name: str, n: int, *, latency: float, output_dir: str, **output) -> list[str]:
    """Dataset + config for a run; returns the ``raygen run`` arguments."""
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows(n, name)))
    (tmp / "workdirs").mkdir(exist_ok=True)
    config = {
        "sim": {"latency_s": latency, "seed": 3, "log_path": str(tmp / "sim-log.jsonl")},
        "ray": {"workers": 2, "sessions_per_worker": 4},
        "env": {"type": "local", "root": str(tmp / "workdirs")},
        "output": {"output_dir": output_dir, "run_name": name, "data_shard_records": 8, **output},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    return ["run", str(dataset), "--config", str(tmp / "run.yaml")]


def outcome_records(objects: dict[str, bytes], run: str) -> list[dict]:
    return [
        json.loads(line)
        for key, body in objects.items()
        if key.startswith(f"{run}/") and key.split("/")[-2] in ("data", "rejected", "failed")
        if key.endswith(".jsonl")
        for line in body.decode().splitlines()
        if line
    ]


def shard_ids(run: str) -> set[str]:
    """Ids of the records in a run's shards (what a resume must not send again)."""
    bodies = bucket_objects(f"{run}/shards/").values()
    return {json.loads(line)["id"] for body in bodies for line in body.decode().splitlines() if line}


def session_starts(tmp: Path) -> collections.Counter:
    log = [json.loads(line) for line in (tmp / "sim-log.jsonl").read_text().splitlines() if line]
    return collections.Counter(e["prompt_sha"] for e in log if e["turn"] == 0)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_run_and_every_command_on_s3(store, tmp_path):
    args = setup_run(tmp_path, "full", 16, latency=0.01, output_dir=f"s3://{BUCKET}/runs")
    proc = subprocess.run(raygen_cmd(*args), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_uri = f"s3://{BUCKET}/runs/full"
    assert run_uri in proc.stderr
    objects = bucket_objects()
    prefix = "runs/full"
    assert {f"{prefix}/manifest.json", f"{prefix}/keys.txt", f"{prefix}/statistics.json"} <= set(objects)
    assert any(k.startswith(f"{prefix}/shards/") for k in objects)
    assert not any(k.endswith(".tmp") or "/work/" in k or k.endswith("driver.lock") for k in objects)
    records = outcome_records(objects, prefix)
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in rows(16, "full"))
    manifest = json.loads(objects[f"{prefix}/manifest.json"])
    assert manifest["config"]["output"]["output_dir"] == f"s3://{BUCKET}/runs"
    for key, body in objects.items():  # the credentials reach no object, and no output of the command
        assert SECRET_KEY.encode() not in body and ACCESS_KEY.encode() not in body, key
    assert SECRET_KEY not in proc.stderr + proc.stdout and ACCESS_KEY not in proc.stderr + proc.stdout

    status = run_cli("status", run_uri)
    assert status.returncode == 0, status.stderr
    assert re.search(r"total\s*│\s*16\s", status.stdout) and re.search(r"pending\s*│\s*0\s", status.stdout)
    merged = run_cli("merge", run_uri, "--no-filter-reasoning")
    assert merged.returncode == 0, merged.stderr
    stats = json.loads(bucket_objects()[f"{prefix}/statistics.json"])
    assert stats["filters"]["no_reasoning"] is False and stats["counts"]["total"] == 16
    report = run_cli("report", run_uri)
    assert report.returncode == 0 and f"{run_uri}/report.html" in report.stderr, report.stderr
    sample = run_cli("sample", run_uri, "--per-category", "1")
    assert sample.returncode == 0, sample.stderr
    sampled = bucket_objects()[f"{prefix}/sample/sample.jsonl"].decode().splitlines()
    assert len(sampled) == len(CATEGORIES)
    assert all(json.loads(s)["review_sample"]["file"].startswith("data/") for s in sampled)
    compare = run_cli("compare", run_uri, run_uri, "--json")
    assert compare.returncode == 0 and json.loads(compare.stdout)["runs"]["a"]["dir"] == run_uri

    # The merged data loads with datasets (s3fs), endpoint and keys from the environment.
    script = textwrap.dedent(
        f"""
        import datasets, os
        ds = datasets.load_dataset("parquet", data_files="{run_uri}/data/*.parquet", split="train",
            storage_options={{"client_kwargs": {{"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}}},
            cache_dir="{tmp_path / "hf"}")
        print(len(ds), sorted(set(ds["category"])))
        """
    )
    # datasets' offline mode refuses s3:// as well: off here (the test has no network beyond loopback).
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")} | {"HF_HOME": str(tmp_path)}
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split()[0] == str(stats["counts"]["kept"])


def test_resume_on_s3_after_sigkill_sends_only_unrecorded_sessions_again(store, tmp_path):
    args = setup_run(tmp_path, "killed", 40, latency=0.25, output_dir=f"s3://{BUCKET}/runs")
    proc = start_group(args, tmp_path / "first.log")
    try:
        wait_for(lambda: len(shard_ids("runs/killed")) >= 6, 300, "recorded sessions")
    finally:
        kill_group(proc)
        stop_leftovers(proc.pid)
    recorded = shard_ids("runs/killed")
    assert 0 < len(recorded) < 40
    before = session_starts(tmp_path)
    resumed = subprocess.run(raygen_cmd(*args, "--resume"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    records = outcome_records(bucket_objects(), "runs/killed")
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in rows(40, "killed"))
    # Sessions recorded before the kill were not sent to the model again; the others were, once.
    after = session_starts(tmp_path) - before
    resent = {prompt_sha(r["prompt"]) for r in rows(40, "killed") if r["id"] in recorded} & set(after)
    assert not resent and max(after.values()) == 1


def test_store_unreachable_mid_run(store, tmp_path):
    # A short outage: writes wait for the store, the run finishes, nothing is sent twice.
    args = setup_run(tmp_path, "outage", 24, latency=0.15, output_dir=f"s3://{BUCKET}/runs")
    proc = subprocess.Popen(raygen_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: bucket_keys("runs/outage/shards/"), 300, "a shard")
    store.cut()
    time.sleep(4)
    store.restore()
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    assert sorted(r["id"] for r in outcome_records(bucket_objects(), "runs/outage")) == sorted(
        r["id"] for r in rows(24, "outage")
    )
    assert max(session_starts(tmp_path).values()) == 1

    # An outage longer than output.storage_retry_s: one clear line, and --resume finishes once it is back.
    (tmp_path / "long").mkdir()
    args = setup_run(
        tmp_path / "long",
        "long-outage",
        24,
        latency=0.15,
        output_dir=f"s3://{BUCKET}/runs",
        storage_retry_s=2,
    )
    proc = subprocess.Popen(raygen_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: bucket_keys("runs/long-outage/shards/"), 300, "a shard")
    store.cut()
    try:
        _out, err = proc.communicate(timeout=600)
    finally:
        store.restore()
    assert proc.returncode not in (0, None)
    error_lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(error_lines) == 1 and f"s3://{BUCKET}/runs/long-outage" in error_lines[0], err[-3000:]
    assert "Traceback" not in err
    resumed = subprocess.run(raygen_cmd(*args, "--resume"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert sorted(r["id"] for r in outcome_records(bucket_objects(), "runs/long-outage")) == sorted(
        r["id"] for r in rows(24, "long-outage")
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_one_driver_per_run(store, tmp_path, where):
    output_dir = str(tmp_path / "runs") if where == "local" else f"s3://{BUCKET}/lock-runs"
    args = setup_run(tmp_path, f"locked-{where}", 30, latency=0.3, output_dir=output_dir)
    lock_exists = (
        (lambda: (tmp_path / "runs" / f"locked-{where}" / "driver.lock").exists())
        if where == "local"
        else (lambda: bool(bucket_keys(f"lock-runs/locked-{where}/driver.lock")))
    )
    first = start_group(args, tmp_path / "first.log")
    try:
        wait_for(lock_exists, 300, "the first driver's lock")
        second = subprocess.run(raygen_cmd(*args, "--resume"), capture_output=True, text=True, timeout=300)
        assert second.returncode == 2
        error_lines = [line for line in second.stderr.splitlines() if line.startswith("error")]
        assert len(error_lines) == 1, second.stderr[-3000:]
        assert f"pid {first.pid}" in error_lines[0] and "since" in error_lines[0]
        status = run_cli("status", output_dir + f"/locked-{where}")
        assert "running" in status.stdout and f"pid {first.pid}" in status.stdout.replace("\n", " ")
    finally:
        kill_group(first)
        stop_leftovers(first.pid)
    assert lock_exists()  # the killed driver's lock is left behind ...
    resumed = subprocess.run(raygen_cmd(*args, "--resume"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]  # ... and taken over at once
    assert not lock_exists()
