"""The merge spread over worker processes (``raygen.output.merge_parallel``) writes what the one-process
merge writes: the same files, byte for byte (Parquet: the same tables and row groups), the same counts,
the same statistics (sums equal up to float rounding: they are added in another order)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import raygen.output.merge as merge
import raygen.output.merge_parallel as merge_parallel
from raygen.config import FilterConfig
from raygen.output.merge import merge_run
from raygen.output.merge_parallel import MergeWorkers
from raygen.output.run_dir import RunDir
from tests.output.test_merge import build_dataset, trajectory, write_shards


def _close(a: object, b: object, where: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _close(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12), where
    else:
        assert a == b, where


def _children(pid: int | None = None) -> set[int]:
    pid = os.getpid() if pid is None else pid
    tasks = Path(f"/proc/{pid}/task")
    found: set[int] = set()
    for task in tasks.iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".jsonl"}


def make_twin_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, set[str]]:
    """Two copies of one run folder (shards from 5 writers, retries, a stale key, a bad shard) and its
    expected keys: one merged one way, the other another."""
    # Row groups of 3 records, so a data shard has several and their order across workers shows.
    monkeypatch.setattr(merge, "_ROW_GROUP_RECORDS", 3)
    monkeypatch.setattr(merge_parallel, "_ROW_GROUP_RECORDS", 3)
    records, final_kind = build_dataset()
    records += [trajectory(f"x{i:03d}", 50 + i, "good", attempt=1 + i % 2) for i in range(40)]
    records += [trajectory("stale", 99, "good")]  # not an expected key
    one = tmp_path / "one"
    write_shards(one, records, writers=5)
    (one / "shards" / "manual-000000.jsonl").write_text('not json at all\n{"sample_key": 3}\n')
    many = tmp_path / "many"
    shutil.copytree(one, many)  # same files, same modification times: the same shard order
    expected = set(final_kind) | {f"x{i:03d}" for i in range(40)}
    return one, many, expected


@pytest.fixture()
def twin_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, set[str]]:
    return make_twin_runs(tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("per_file", "forked_before"),
    [(7, False), (30, False), (7, True)],
    ids=["workers-write-files", "workers-build-row-groups", "workers-forked-before"],
)
def test_parallel_merge_writes_what_one_process_writes(twin_runs, per_file, forked_before):
    # 7 a file: 8 data files for 3 workers, each writes whole files; 30: 2 files, groups spread.
    # forked_before: the workers a run forks before Ray starts (MergeWorkers.fork), used by both passes.
    one, many, expected = twin_runs
    serial = merge_run(one, FilterConfig(), data_shard_records=per_file, expected_keys=expected, processes=1)
    with contextlib.ExitStack() as stack:
        others = _children()  # e.g. a server another test of this worker started
        workers = stack.enter_context(MergeWorkers.fork(3)) if forked_before else None
        pids = _children() - others
        spread = merge_run(
            many,
            FilterConfig(),
            data_shard_records=per_file,
            expected_keys=expected,
            processes=3,
            workers=workers,
        )
        if forked_before:  # the merge ran on them: no other process was started for it
            assert len(pids) == 3 and _children() - others == pids

    assert spread.kept and spread.rejected and spread.failed  # every kind of output is exercised
    assert spread.data_shards == serial.data_shards >= 2
    for field in ("kept", "rejected", "failed", "keys", "records_read", "stale", "unparseable_lines"):
        assert getattr(spread, field) == getattr(serial, field), field
    assert spread.attempts_superseded == serial.attempts_superseded > 0
    for folder in ("data", "rejected", "failed"):
        assert _files(many / folder) == _files(one / folder), folder
    groups = []
    for path in sorted((one / "data").glob("*.parquet")):
        ours, theirs = pq.ParquetFile(path), pq.ParquetFile(many / "data" / path.name)
        assert ours.metadata.num_row_groups == theirs.metadata.num_row_groups
        groups.append(theirs.metadata.num_row_groups)
        assert ours.read().equals(theirs.read())
    assert max(groups) > 1
    spread_stats, serial_stats = (RunDir.of(run).read_json("statistics.json") for run in (many, one))
    # Pass 1 of a parallel merge digests every shard (digests.py); one process reads them as they are.
    assert spread_stats["merge"].pop("shard_digests") == {
        "reused": 0,
        "built": spread_stats["merge"]["shard_files"],
    }
    assert serial_stats["merge"].pop("shard_digests") == {"reused": 0, "built": 0}
    _close(spread_stats, serial_stats)


def test_small_local_runs_stay_in_one_process(tmp_path):
    records, _ = build_dataset()
    write_shards(tmp_path, records)
    run = RunDir.of(tmp_path)
    assert merge_parallel.merge_processes(run, None, None) == 1
    assert merge_parallel.merge_processes(run, object(), 4) == 1  # the Hermes export: one ordered writer
    assert merge_parallel.merge_processes(run, None, 4) == 4


def test_workers_forked_ahead_are_stopped_with_their_block_and_die_with_a_killed_driver(tmp_path):
    others = _children()  # e.g. a server another test of this worker started
    with MergeWorkers.fork(2) as workers:
        started = _children() - others
        assert len(started) == 2 and workers.processes == 2
    assert not _children() & started  # the block's end stopped them

    # A driver SIGKILLed mid-run has no block end: its workers must not wait on the pool's queue forever.
    code = (
        "import sys, time; from raygen.output.merge_parallel import MergeWorkers\n"
        "with MergeWorkers.fork(2):\n    print('up', flush=True); time.sleep(60)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "up"
        orphans = _children(driver.pid)
        assert len(orphans) == 2
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in orphans) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in orphans if Path(f"/proc/{pid}").exists()]
    finally:
        driver.kill()
