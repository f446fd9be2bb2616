"""Shared fixtures of the merge tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import raygen.output.merge as merge
import raygen.output.merge_parallel as merge_parallel
from tests.output.test_merge import build_dataset, trajectory, write_shards


@pytest.fixture()
def twin_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, set[str]]:
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
