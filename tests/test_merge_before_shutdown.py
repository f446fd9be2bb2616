"""The run merges before Ray's shutdown (issue 27: the shutdown took 1.5 s on one node, between the last
session and the data), on merge workers forked before Ray started, and stops them after."""

from __future__ import annotations

import functools
import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

import raygen.run.driver as driver
from raygen.cli.console import ConsoleReporter
from raygen.config import FilterConfig, RunConfig
from raygen.output.digests import Compactor
from raygen.output.merge import merge_run

pytestmark = pytest.mark.ray


def _jsonl(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.jsonl"))}


def test_the_run_merges_on_workers_forked_before_ray_and_before_its_shutdown(tmp_path, monkeypatch):
    import ray

    seen: list[tuple[bool, list[int]]] = []
    real_merge = driver._merge

    def watched_merge(*args, **kwargs):
        workers = args[-1]
        seen.append((ray.is_initialized(), sorted(workers.pool._processes) if workers else []))
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(driver, "_merge", watched_merge)
    # Shards digested as soon as they are written (a run waits 5 s for a shard to settle).
    monkeypatch.setattr(driver, "Compactor", functools.partial(Compactor, settle_s=0.0, interval_s=0.05))
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"echo row {i}"}) + "\n" for i in range(30)))
    config = RunConfig.model_validate(
        {
            "dataset": str(dataset),
            "model": {"type": "scripted", "latency_s": 0.05},  # a run of ~1 s, shards along the way
            "env": {"type": "fake"},
            "ray": {"workers": 1, "sessions_per_worker": 8},
            "output": {
                "output_dir": str(tmp_path / "runs"),
                "run_name": "early",
                "merge_processes": 2,
                "shard_max_records": 4,  # shards that close during the run (the open one keeps growing)
                "data_shard_records": 4,  # 8 data files: each of the 2 workers writes whole files
            },
        }
    )
    result = driver.run(config, reporter=ConsoleReporter(Console(file=io.StringIO())))

    [(ray_up, pids)] = seen
    assert ray_up and len(pids) == 2
    assert not ray.is_initialized()
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]  # stopped with the run
    out = result.run_dir.local_path
    assert result.merge is not None and result.merge.kept == 30 and result.merge.data_shards == 8
    digests = json.loads((out / "statistics.json").read_text())["merge"]["shard_digests"]
    assert digests["reused"] > 0  # digested during the run, on the same workers
    # What a one-process merge of the same shards writes, byte for byte.
    again = tmp_path / "again"
    shutil.copytree(out, again)
    merge_run(again, FilterConfig(), 4, processes=1)
    for folder in ("data", "rejected", "failed"):
        assert _jsonl(again / folder) == _jsonl(out / folder), folder
