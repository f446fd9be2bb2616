"""Records carry ``format_version``; every reader refuses a newer one in one line (docs/output.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import build_run
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.errors import RecordFormatError
from raygen.eval.runread import iter_run_records
from raygen.formats.records import FORMAT_VERSION, Trajectory, check_format_version
from raygen.output.run_dir import RunDir
from raygen.output.shards import ShardWriter, iter_shard_records


def test_records_are_written_with_the_current_version(make_run):
    run_dir = make_run("current", 6, nasty=False)
    assert Trajectory(id="a", sample_key="a", prompt_index=0).format_version == FORMAT_VERSION
    for path in (run_dir / "data").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            assert json.loads(line)["format_version"] == FORMAT_VERSION
    table = pq.read_table(next((run_dir / "data").glob("*.parquet")))
    assert set(table.column("format_version").to_pylist()) == {FORMAT_VERSION}


def test_records_without_the_field_are_version_one():
    check_format_version({"sample_key": "k"}, "old")  # written before the field existed
    with pytest.raises(RecordFormatError, match=r"^where: record format_version 99 is newer"):
        check_format_version({"format_version": 99}, "where")
    with pytest.raises(RecordFormatError):
        check_format_version({"format_version": "2"}, "where")


def _add_newer_record(run_dir: Path) -> str:
    newer = json.loads(Trajectory(id="n", sample_key="newer", prompt_index=99).model_dump_json())
    newer["format_version"] = FORMAT_VERSION + 1
    writer = ShardWriter(run_dir, "newer-raygen", max_records=10, flush_s=3600)
    writer.add(json.dumps(newer))
    writer.close()
    return "newer-raygen"


def test_shard_readers_name_the_file_and_line(make_run):
    run_dir = make_run("mixed", 6, nasty=False)
    shard = _add_newer_record(run_dir)
    with pytest.raises(RecordFormatError, match=rf"{shard}.*:1: record format_version {FORMAT_VERSION + 1}"):
        list(iter_shard_records(run_dir))


@pytest.mark.parametrize("command", ["merge", "status"])
def test_commands_refuse_a_newer_run_in_one_line(tmp_path: Path, command: str):
    run_dir = build_run(tmp_path, "newer", 6, nasty=False)
    RunDir(run_dir).write_keys({record["sample_key"] for record, _ in iter_shard_records(run_dir)})
    before = sorted(p.name for p in (run_dir / "data").iterdir())
    _add_newer_record(run_dir)
    result = CliRunner().invoke(app, [command, str(run_dir)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "is newer than this raygen reads" in lines[0], result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in (run_dir / "data").iterdir()) == before  # nothing half-merged


def test_report_refuses_newer_merged_records(make_run):
    run_dir = make_run("merged-newer", 6, nasty=False)
    data = next((run_dir / "data").glob("*.jsonl"))
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[-1]["format_version"] = FORMAT_VERSION + 1
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(RecordFormatError, match=rf"{data.name}:{len(rows)}: record format_version"):
        list(iter_run_records(run_dir))
    result = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(run_dir / "r.html")])
    assert result.exit_code == 2 and "is newer than this raygen reads" in result.output, result.output
