"""``raygen export`` from a run folder on S3 (moto on loopback) to an export folder on S3."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("moto")

from s3_server import MotoServer, environment, make_bucket, s3_env

from raygen.export.run import ExportOptions, export_run
from raygen.output.run_dir import RunDir
from tests.export.conftest import TOKENIZER, kept_records


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    make_bucket(server.url, "bkt")
    with environment(s3_env(server.url)):
        yield server
    server.stop()


def test_export_reads_and_writes_object_storage(s3, run_dir):
    remote = RunDir("s3://bkt/runs/r")
    for path in [run_dir / "manifest.json", *sorted((run_dir / "data").glob("*"))]:
        name = str(path.relative_to(run_dir))
        remote.write_bytes(name, [path.read_bytes()])
    out = "s3://bkt/exports/tokens"
    result = export_run(remote, ExportOptions(fmt="tokens", out=out, tokenizer=TOKENIZER, check=True))
    assert result.rows == len(kept_records(run_dir)) == 8
    exported = RunDir(out)
    table = pq.read_table(io.BytesIO(exported.read_bytes("train-00000.parquet")))
    assert table.num_rows == 8 and sorted(table.column("token_source").to_pylist()).count("captured") == 6
    assert exported.read_json("export.json")["rows"] == 8
    assert exported.read_json("template_check.json")["server_ids"]["matched"] == 6
    assert remote.read_json("template_check.json")["export"] == out  # the copy raygen report reads
    # a second export into the same folder replaces its files
    export_run(remote, ExportOptions(fmt="openai", out=out))
    names = sorted(e.name for e in exported.storage.list(exported.root))
    assert names == ["export.json", "train-00000.jsonl"]
    rows = [json.loads(line) for line in exported.read_bytes("train-00000.jsonl").splitlines()]
    assert len(rows) == 8 and all("messages" in r and "tools" in r for r in rows)
