"""Shard digests (``raygen.output.digests``): built during a run or by the merge's pass 1, they make the
merge quicker and never different. A stale or broken digest is not used; pass 2 takes its rows from them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raygen.output.digests as digests
import raygen.output.merge as merge
import raygen.output.merge_parallel as merge_parallel
from raygen.config import FilterConfig
from raygen.output.digests import Compactor, digest_path, rows_path
from raygen.output.merge import merge_run
from raygen.output.merge_parallel import MergeWorkers
from raygen.output.run_dir import RunDir
from raygen.run.ledger import Ledger
from tests.output.test_merge import build_dataset, trajectory, write_shards
from tests.output.test_merge_parallel import _files, make_twin_runs


@pytest.fixture()
def twin_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, set[str]]:
    return make_twin_runs(tmp_path, monkeypatch)


def _merge(run: Path, expected: set[str], processes: int) -> merge.MergeResult:
    return merge_run(run, FilterConfig(), data_shard_records=7, expected_keys=expected, processes=processes)


def _assert_same_output(one: Path, many: Path) -> None:
    for folder in ("data", "rejected", "failed"):
        assert _files(many / folder) == _files(one / folder), folder
    for path in sorted((one / "data").glob("*.parquet")):
        assert path.read_bytes() == (many / "data" / path.name).read_bytes(), path.name


@pytest.mark.parametrize("torn", ["index", "rows"])
def test_digests_built_during_the_run_make_the_same_merge(twin_runs, monkeypatch, torn):
    one, many, expected = twin_runs
    serial = _merge(one, expected, processes=1)
    run = RunDir.of(many)
    shards = run.list_shards()
    with (
        MergeWorkers.fork(2) as workers,
        Compactor(run, workers.pool, settle_s=0.0, interval_s=0.05) as compactor,
    ):
        deadline = time.monotonic() + 60
        while compactor.built < len(shards) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert compactor.built == len(shards)  # each shard once: a digest still fresh is not rebuilt
    assert not compactor._thread.is_alive()  # stopped with its block, before the workers
    # One shard was touched since its digest: its digest is not used.
    os.utime(shards[1].path, ns=(shards[1].mtime_ns, shards[1].mtime_ns + 1))
    shutil.copystat(shards[1].path, one / "shards" / shards[1].name)  # the same shard order in both
    if torn == "index":  # pass 1 rebuilds it; then pass 2 takes every data/ row from a digest
        digest_path(run, shards[0].name).write_bytes(b"ARROW1 torn")
        monkeypatch.setattr(merge_parallel, "to_arrow_table", lambda records: 1 / 0)
    else:  # rows files torn, or not of their index's build: pass 2 reads those records themselves
        rows_path(run, shards[0].name).write_bytes(b"ARROW1 torn")
        other_build = pa.ipc.open_file(pa.memory_map(str(rows_path(run, shards[2].name)))).read_all()
        digests._write(rows_path(run, shards[2].name), other_build, {"size": 1, "mtime_ns": 1}, None)
    spread = _merge(many, expected, processes=2)
    stats = run.read_json("statistics.json")["merge"]
    rebuilt = 2 if torn == "index" else 1  # a rows file alone is not rebuilt: pass 2 reads the shard
    assert stats["shard_digests"] == {"reused": len(shards) - rebuilt, "built": rebuilt}
    assert stats["unparseable_lines"] == 1 and stats["invalid_records"] == 1  # as read from the shards
    for field in ("kept", "rejected", "failed", "records_read", "invalid_records", "attempts_superseded"):
        assert getattr(spread, field) == getattr(serial, field), field
    _assert_same_output(one, many)
    assert pq.ParquetFile(next((many / "data").glob("*.parquet"))).metadata.num_row_groups > 1


def test_a_shard_rewritten_after_its_digest_is_read_again(twin_runs):
    one, many, expected = twin_runs
    run = RunDir.of(many)
    with MergeWorkers.fork(2) as workers:
        Compactor(run, workers.pool, settle_s=0.0).compact_settled()
    # The run's open shard grows until full: the same name, more records, a new modification time.
    for folder in (one, many):
        grown = sorted((folder / "shards").glob("node0-*.jsonl"))[-1]
        with open(grown, "a", encoding="utf-8") as f:
            f.write(trajectory("late", 200, "good").model_dump_json() + "\n")
    expected = expected | {"late"}
    serial = _merge(one, expected, processes=1)
    spread = _merge(many, expected, processes=2)
    assert spread.kept == serial.kept and spread.missing == serial.missing == 0  # "late" is in
    assert run.read_json("statistics.json")["merge"]["shard_digests"]["built"] == 1
    _assert_same_output(one, many)


def test_the_compactor_leaves_unsettled_shards_and_survives_a_failing_round(twin_runs, caplog):
    _, many, _ = twin_runs
    run = RunDir.of(many)

    class BrokenPool:
        def submit(self, *args):
            raise RuntimeError("pool gone")

    with MergeWorkers.fork(2) as workers:
        waiting = Compactor(run, workers.pool, settle_s=3600.0)
        waiting.compact_settled()
        assert waiting.built == 0  # every shard changed within the last hour: maybe still growing
    with Compactor(run, BrokenPool(), settle_s=0.0, interval_s=0.01) as broken:
        deadline = time.monotonic() + 30
        while "digesting shards during the run failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "digesting shards during the run failed (the merge will): pool gone" in caplog.text
    assert broken.built == 0 and not broken._thread.is_alive()


def test_a_dead_merge_worker_stops_the_compactor_and_the_merge_runs_in_one_process(twin_runs, caplog):
    one, many, expected = twin_runs
    serial = _merge(one, expected, processes=1)
    with MergeWorkers.fork(2) as workers:
        os.kill(next(iter(workers.pool._processes)), signal.SIGKILL)  # e.g. the kernel's OOM killer
        deadline = time.monotonic() + 30
        while not workers.broken and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers.broken
        with Compactor(RunDir.of(many), workers.pool, settle_s=0.0, interval_s=0.01) as compactor:
            compactor._thread.join(30)
            assert not compactor._thread.is_alive()  # it gave up on its own, once
        spread = merge_run(
            many, FilterConfig(), data_shard_records=7, expected_keys=expected, processes=2, workers=workers
        )
    assert "a merge worker died: merging in one process" in caplog.text
    assert caplog.text.count("digesting shards during the run failed") == 1
    assert (spread.kept, spread.rejected, spread.failed) == (serial.kept, serial.rejected, serial.failed)
    _assert_same_output(one, many)


def _ledger_state(ledger: Ledger) -> tuple:
    keys = {
        key: (s.attempts, s.succeeded, s.last_failure, s.uncounted, s.reopened_until)
        for key, s in ledger.keys.items()
    }
    return keys, ledger.records, round(ledger.spent_usd, 12), ledger.spent_tokens, ledger.config_fingerprints


def test_a_resumes_ledger_reads_the_digests_as_it_reads_the_shards(tmp_path, monkeypatch):
    """``Ledger.scan`` (a resume's read of the run) takes the summaries and config fingerprints from the
    digests where they are valid, the rest from the shards, and comes to the same state."""
    records, _ = build_dataset()
    for i, record in enumerate(records):
        record.config_fingerprint = f"fp-{i % 3}"
        record.cost_usd = 0.001 * (i + 1)
    one = tmp_path / "one"
    write_shards(one, records, writers=3)
    (one / "shards" / "manual-000000.jsonl").write_text('not json at all\n{"sample_key": 3}\n')
    many = tmp_path / "many"
    shutil.copytree(one, many)
    run = RunDir.of(many)
    shards = run.list_shards()
    assert all(digests.build_digest(run, entry) is not None for entry in shards)
    # A digest written before digests held the fingerprints: that shard is read itself.
    index, meta = digests._read_ipc(digest_path(run, shards[0].name))
    del meta["config_fingerprints"]
    digests._write(digest_path(run, shards[0].name), index, meta, None)
    parsed: list[str] = []
    summarize = digests.summarize
    monkeypatch.setattr(
        digests, "summarize", lambda record: parsed.append(record["sample_key"]) or summarize(record)
    )
    from_digests = Ledger.scan(many)
    old_digests_shard = (many / "shards" / shards[0].name).read_text().splitlines()
    assert parsed == [json.loads(line)["sample_key"] for line in old_digests_shard]
    parsed.clear()
    from_shards = Ledger.scan(one)  # no digests there
    assert len(parsed) > len(shards)
    assert from_shards.config_fingerprints == {"fp-0", "fp-1", "fp-2"}
    assert _ledger_state(from_digests) == _ledger_state(from_shards)
