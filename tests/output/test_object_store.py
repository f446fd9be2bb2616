"""RunDir on a real S3-compatible server (moto, loopback): documents, shards, the merge, readers, the
leak count and ``datasets.load_dataset`` over ``s3://``, and clear one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("moto")

from s3_server import MotoServer, Relay, environment, make_bucket, s3_env

from raygen.config import FilterConfig
from raygen.errors import ConfigError
from raygen.formats.records import Trajectory
from raygen.hygiene import count_secret_leaks
from raygen.output.merge import merge_run
from raygen.output.run_dir import RunDir
from raygen.output.shards import RecordReader, ShardWriter, iter_shard_records
from raygen.output.storage import StorageError


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    make_bucket(server.url, "bkt")
    with environment(s3_env(server.url)):
        yield server
    server.stop()


def trajectory(i: int, *, secret: str = "") -> str:
    return Trajectory(
        id=f"row-{i}",
        sample_key=f"key-{i:03d}",
        prompt_index=i,
        category="bash" if i % 2 else "sql",
        completed=True,
        exit_status="completed",
        messages=[
            {"role": "user", "content": f"task {i} {secret}"},
            {"role": "assistant", "content": "done", "reasoning_content": "because"},
        ],
        conversations=[{"from": "human", "value": f"task {i}"}, {"from": "gpt", "value": "done"}],
        reasoning={"with_reasoning": 1, "without_reasoning": 0},
    ).model_dump_json()


def test_documents_and_shards_round_trip(s3):
    run = RunDir("s3://bkt/runs/docs/")
    assert str(run) == "s3://bkt/runs/docs" and not run.is_local and run.is_empty()
    run.write_json("manifest.json", {"run_name": "docs", "ünïcode": "✓"})
    run.write_keys({"b", "a"})
    assert run.read_manifest()["ünïcode"] == "✓" and run.read_keys() == {"a", "b"}
    writer = ShardWriter(run, "w", max_records=3, flush_s=3600)
    for i in range(7):
        writer.add(trajectory(i))
    writer.close()
    assert [p.name for p in writer.paths] == ["w-000000.jsonl", "w-000001.jsonl", "w-000002.jsonl"]
    records = list(iter_shard_records(run))
    assert sorted(r["prompt_index"] for r, _ in records) == list(range(7))
    with RecordReader(run_dir=run) as reader:  # positions re-read the same records, in any order
        for record, pos in reversed(records):
            assert reader.read(pos) == record
    assert not run.is_empty() and not run.exists("statistics.json")


@pytest.mark.slow
def test_merge_writes_outputs_that_datasets_loads_over_s3(s3, tmp_path):
    run = RunDir("s3://bkt/runs/merged")
    writer = ShardWriter(run, "w", max_records=4, flush_s=3600)
    for i in range(10):
        writer.add(trajectory(i))
    writer.close()
    first = merge_run(run, FilterConfig(), data_shard_records=4)
    assert (first.kept, first.data_shards) == (10, 3)
    # A second merge with bigger shards replaces the first one's files: no stale train-*-of-00003 left.
    second = merge_run(run, FilterConfig(), data_shard_records=100)
    names = sorted(e.name for e in run.storage.list(run.path("data")))
    assert names == ["README.md", "train-00000-of-00001.jsonl", "train-00000-of-00001.parquet"]
    assert run.read_json("statistics.json")["counts"]["kept"] == second.kept == 10
    # The documented way to load it: datasets + s3fs, endpoint and keys from the environment.
    script = textwrap.dedent(
        """
        import datasets, json, os
        opts = {"client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
        ds = datasets.load_dataset("parquet", data_files="s3://bkt/runs/merged/data/*.parquet",
                                   storage_options=opts, split="train", cache_dir=os.environ["CACHE"])
        print(json.dumps(sorted(ds["sample_key"])))
        """
    )
    env = {**s3_env(s3.url), "CACHE": str(tmp_path / "hf"), "PATH": "/usr/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [f"key-{i:03d}" for i in range(10)]


def test_leak_count_reads_every_object(s3):
    run = RunDir("s3://bkt/runs/leaky")
    secret = "sk-leaked-value-0123456789abcdef"
    writer = ShardWriter(run, "w", max_records=10, flush_s=3600)
    writer.add(trajectory(1, secret=secret))
    writer.add(trajectory(2))
    writer.close()
    merge_run(run, FilterConfig(), data_shard_records=10)
    leaks = count_secret_leaks(run, [secret])
    # once in the shard, once in data/*.jsonl (Parquet is skipped as a copy of the JSONL)
    assert leaks["secret_leaks_by_folder"] == {"data": 1, "shards": 1}


def test_credentials_in_the_uri_are_refused_without_echoing_them(s3):
    with pytest.raises(ConfigError) as err:
        RunDir("s3://AKIAEXAMPLE:supersecret@bkt/runs/x")
    assert "supersecret" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)
    assert "environment" in str(err.value)


def test_a_missing_bucket_is_one_clear_line(s3):
    run = RunDir("s3://no-such-bucket/runs/x")
    with pytest.raises(StorageError) as err:
        run.write_json("manifest.json", {})
    message = str(err.value)
    assert "\n" not in message and "s3://no-such-bucket/runs/x" in message
    assert "bucket does not exist" in message.lower() and "Request ID" not in message


def test_writes_wait_for_storage_that_comes_back(s3, monkeypatch):
    relay = Relay(s3.port)
    try:
        with environment({"AWS_ENDPOINT_URL": relay.url}):
            run = RunDir("s3://bkt/runs/outage")
            run.storage.retry_s = 30
            run.write_json("manifest.json", {"n": 1})
            relay.cut()
            restore = __import__("threading").Timer(3.0, relay.restore)
            restore.start()
            writer = ShardWriter(run, "w", max_records=10, flush_s=3600)
            writer.add(trajectory(1))
            writer.flush()  # fails while cut, retried until the relay is back
            restore.join()
            assert [r["sample_key"] for r, _ in iter_shard_records(run)] == ["key-001"]
            relay.cut()
            run.storage.retry_s = 1
            writer.add(trajectory(2))
            with pytest.raises(StorageError) as err:
                writer.flush()
            assert "\n" not in str(err.value) and "s3://bkt/runs/outage" in str(err.value)
            assert writer.pending == 1  # kept for a later flush: nothing finished is dropped
            relay.restore()
            writer.close()
            assert sorted(r["sample_key"] for r, _ in iter_shard_records(run)) == ["key-001", "key-002"]
    finally:
        relay.close()


def test_a_rescore_wins_over_its_session_whatever_the_upload_order(s3):
    # issue 28 case 4 on the store it names: an object's date is its upload time, so the session's own
    # shard, uploaded after the rescore's, is the newer file. The regrade must still win.
    import time

    run = RunDir("s3://bkt/runs/rescored")

    def graded(i: int, reward: float, rescored: int) -> str:
        record = json.loads(trajectory(i))
        verification = {"passed": reward == 1.0, "exit_code": 0, "session_status": "completed"}
        record.update(reward=reward, verification={**verification, "rescored": rescored})
        return json.dumps(record)

    for writer_id, reward, rescored in (("rescore-0a1b", 1.0, 1), ("driver-0001", 0.0, 0)):
        writer = ShardWriter(run, writer_id, max_records=100, flush_s=3600)
        for i in range(4):
            writer.add(graded(i, reward, rescored))
        writer.close()
        time.sleep(1.1)  # a store's dates may be whole seconds
    assert [e.name.split("-")[0] for e in run.list_shards()] == ["rescore", "driver"]
    merged = merge_run(run, FilterConfig(), data_shard_records=100)
    assert (merged.kept, merged.attempts_superseded) == (4, 4)
    files = run.output_files("data")
    rows = [json.loads(line) for path in files for line in run.storage.read_bytes(path).splitlines()]
    assert sorted(r["reward"] for r in rows) == [1.0] * 4
