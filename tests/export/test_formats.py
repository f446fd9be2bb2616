"""Each message format of ``raygen export`` loads with ``datasets`` and has the shape its trainer reads."""

from __future__ import annotations

import json

import datasets
import pytest
from typer.testing import CliRunner

from raygen.cli import app
from raygen.errors import ConfigError
from raygen.export.run import ExportOptions, export_run
from raygen.formats.chat_template import render_ids, render_text
from raygen.output.hermes import offered_schemas
from tests.export.conftest import TOKENIZER, kept_records


def _load(out, pattern="*.jsonl"):
    return datasets.load_dataset("json", data_files=str(out / pattern), split="train")


def test_openai_fine_tuning_rows(run_dir, tmp_path):
    out = tmp_path / "openai"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--to", "openai", "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = kept_records(run_dir)
    ds = _load(out)
    assert len(ds) == len(records) == 8
    allowed = {
        "system": {"role", "content"},
        "user": {"role", "content"},
        "tool": {"role", "tool_call_id", "content"},
    }
    for row in (json.loads(line) for line in (out / "train-00000.jsonl").open()):
        names = {t["function"]["name"] for t in row["tools"]}
        assert names == {"patch", "read_file", "search_files", "terminal", "write_file"}
        assert all(t["type"] == "function" and "parameters" in t["function"] for t in row["tools"])
        for message in row["messages"]:
            if message["role"] == "assistant":
                assert set(message) <= {"role", "content", "tool_calls", "weight"} and message["weight"] in (
                    0,
                    1,
                )
                for call in message.get("tool_calls", []):
                    assert isinstance(json.loads(call["function"]["arguments"]), dict)
            else:
                assert set(message) == allowed[message["role"]]
        assert [m.get("weight") for m in row["messages"] if m["role"] == "assistant"] == [1, 1, 1]
    # datasets reads the same rows back (messages of mixed shapes included)
    assert ds[0]["messages"][0]["role"] == "system"


def test_trl_rows_render_as_the_stored_conversation(run_dir, tmp_path, tokenizer):
    """TRL's SFTTrainer renders ``apply_chat_template(messages, tools=tools)`` per row: after the round
    trip through ``datasets`` it must give exactly what the stored record renders to."""
    out = tmp_path / "trl"
    export_run(run_dir, ExportOptions(fmt="trl", out=str(out)))
    records = kept_records(run_dir)
    ds = _load(out)
    assert set(ds.column_names) == {"id", "messages", "tools"}
    for row in ds:
        record = records[row["id"]]
        assert isinstance(row["messages"], list) and all(
            "role" in m and "content" in m for m in row["messages"]
        )
        calls = [c for m in row["messages"] for c in m.get("tool_calls") or []]
        assert calls and all(isinstance(c["function"]["arguments"], dict) for c in calls)
        tools = [{"type": "function", "function": s} for s in offered_schemas(record)]
        expected = render_text(tokenizer, record["messages"], tools, generation_prompt=False)
        rendered = tokenizer.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        assert rendered == expected


def test_sharegpt_and_hermes_load(run_dir, tmp_path):
    for fmt in ("sharegpt", "hermes"):
        out = tmp_path / fmt
        export_run(run_dir, ExportOptions(fmt=fmt, out=str(out), rows_per_shard=3))
        assert sorted(p.name for p in out.glob("train-*")) == [
            "train-00000.jsonl",
            "train-00001.jsonl",
            "train-00002.jsonl",
        ]
        ds = _load(out)
        assert len(ds) == 8
        first = ds[0]["conversations"]
        assert first[0]["from"] == "system" and first[1]["from"] == "human" and first[2]["from"] == "gpt"
    assert "<tool_call>" in ds[0]["conversations"][2]["value"]  # hermes: the reference's assistant turn


def test_export_folder_is_replaced_but_never_a_foreign_one(run_dir, tmp_path):
    out = tmp_path / "again"
    export_run(run_dir, ExportOptions(fmt="sharegpt", out=str(out), rows_per_shard=3))
    export_run(run_dir, ExportOptions(fmt="sharegpt", out=str(out), rows_per_shard=100))
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "train-00000.jsonl"]
    summary = json.loads((out / "export.json").read_text())
    assert summary["rows"] == 8 and summary["format"] == "sharegpt"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export_run(run_dir, ExportOptions(fmt="openai", out=str(foreign)))
    with pytest.raises(ConfigError, match="--tokenizer"):
        export_run(run_dir, ExportOptions(fmt="openai", out=str(tmp_path / "x"), check=True))
    with pytest.raises(ConfigError, match="choose one of"):
        export_run(run_dir, ExportOptions(fmt="alpaca", out=str(tmp_path / "y")))


def test_cut_at_a_turn_boundary(run_dir, tmp_path, tokenizer):
    """--max-length with --over-length cut keeps the conversation through its last reply that fits."""
    records = kept_records(run_dir)
    schemas = {
        rid: [{"type": "function", "function": s} for s in offered_schemas(r)] for rid, r in records.items()
    }
    lengths = {
        rid: len(render_ids(tokenizer, r["messages"], schemas[rid], generation_prompt=False))
        for rid, r in records.items()
    }
    limit = sorted(lengths.values())[0] - 1  # every trajectory is over it
    out = tmp_path / "cut"
    result = export_run(
        run_dir,
        ExportOptions(fmt="trl", out=str(out), tokenizer=TOKENIZER, max_length=limit, over_length="cut"),
    )
    assert result.rows == result.cut == 8
    for row in _load(out):
        assert row["messages"][-1]["role"] == "assistant"
        assert len(row["messages"]) < len(records[row["id"]]["messages"])
        assert len(render_ids(tokenizer, row["messages"], row["tools"], generation_prompt=False)) <= limit
    dropped = export_run(
        run_dir, ExportOptions(fmt="trl", out=str(tmp_path / "drop"), tokenizer=TOKENIZER, max_length=limit)
    )
    assert dropped.rows == 0 and dropped.skipped == {f"over --max-length {limit}": 8}


def test_large_rows_close_a_shard_early(run_dir, tmp_path, monkeypatch):
    """Memory stays bounded: a shard closes at its size limit before it has ``rows_per_shard`` rows."""
    from raygen.export import writer

    monkeypatch.setattr(writer, "SHARD_BYTES", 1)
    monkeypatch.setattr(writer, "SHARD_TOKENS", 1)
    for fmt, suffix in (("openai", "jsonl"), ("tokens", "parquet")):
        out = tmp_path / fmt
        result = export_run(run_dir, ExportOptions(fmt=fmt, out=str(out)))
        assert len(result.files) == result.rows > 1
        assert all(name.endswith(suffix) for name in result.files)
