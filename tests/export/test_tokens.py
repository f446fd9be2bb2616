"""``raygen export --to tokens``: token-in/token-out rows as RL trainers read them; they round-trip."""

from __future__ import annotations

import datasets
import pyarrow.parquet as pq
import pytest

from raygen.export.render import render_record
from raygen.export.run import ExportOptions, export_run
from raygen.export.tokens import captured_row, rendered_row
from raygen.export.writer import TOKENS_SCHEMA
from raygen.formats.chat_template import render_text
from raygen.output.hermes import offered_schemas
from tests.export.conftest import TOKENIZER, kept_records


def _tools(record):
    return [{"type": "function", "function": s} for s in offered_schemas(record)]


def _rows(out):
    ds = datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train")
    return {row["id"]: row for row in ds}


def test_captured_ids_round_trip_without_a_tokenizer(run_dir, tmp_path, tokenizer):
    out = tmp_path / "tokens"
    result = export_run(run_dir, ExportOptions(fmt="tokens", out=str(out)))
    assert result.rows == 6 and result.sources == {"captured": 6}
    assert result.skipped == {"no token ids captured (sampling.return_token_ids), and no --tokenizer": 2}
    assert pq.read_schema(next(out.glob("*.parquet"))).equals(TOKENS_SCHEMA, check_metadata=False)
    records, rows = kept_records(run_dir), _rows(out)
    assert sorted((r["group_id"], r["sample_index"]) for r in rows.values()) == [
        ("g0", 0),
        ("g0", 1),
        ("g1", 0),
        ("g1", 1),
        ("g2", 0),
        ("g2", 1),
    ]
    for rid, row in rows.items():
        record = records[rid]
        full = render_text(tokenizer, record["messages"], _tools(record), generation_prompt=False)
        # decoding the ids the server sent gives the conversation back; the template's last newline after
        # the final end-of-turn token was never generated
        assert tokenizer.decode(row["prompt_ids"] + row["response_ids"]) + "\n" == full
        assert row["num_tokens"] == len(row["prompt_ids"]) + len(row["response_ids"])
        assert len(row["loss_mask"]) == len(row["response_ids"]) == len(row["logprobs"])
        captured = [lp for t in record["turns"] for lp in t["logprobs"]]
        trained = [lp for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m]
        assert trained == pytest.approx(captured, abs=1e-6)
        assert all(lp == 0.0 for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if not m)
        # the trained tokens are exactly the model's replies, each through its end-of-turn token
        replies = [i for t in record["turns"] for i in t["token_ids"]]
        assert [i for i, m in zip(row["response_ids"], row["loss_mask"], strict=True) if m] == replies
        assert not row["is_truncated"] and not row["has_error"] and row["token_source"] == "captured"


def test_rendered_rows_where_nothing_was_captured(run_dir, tmp_path, tokenizer):
    out = tmp_path / "tokens-rendered"
    result = export_run(run_dir, ExportOptions(fmt="tokens", out=str(out), tokenizer=TOKENIZER))
    assert result.rows == 8 and result.sources == {"captured": 6, "rendered": 2}
    records = kept_records(run_dir)
    for rid, row in _rows(out).items():
        if row["token_source"] != "rendered":
            continue
        record = records[rid]
        full = render_text(tokenizer, record["messages"], _tools(record), generation_prompt=False)
        assert tokenizer.decode(row["prompt_ids"] + row["response_ids"]) == full
        assert row["logprobs"] is None  # none were captured
        masked = tokenizer.decode(
            [i for i, m in zip(row["response_ids"], row["loss_mask"], strict=True) if m]
        )
        for message in record["messages"]:
            if message["role"] == "assistant" and message.get("reasoning_content"):
                assert message["reasoning_content"] in masked
        assert "<|im_start|>tool" not in masked and "<|im_start|>assistant" not in masked


def test_both_sources_agree_where_the_template_is_the_servers(run_dir, tokenizer):
    for record in kept_records(run_dir).values():
        captured = captured_row(record)
        if captured is None:
            continue
        rendered = rendered_row(record, render_record(tokenizer, record["messages"], _tools(record)))
        assert rendered.prompt_ids == captured.prompt_ids
        assert rendered.response_ids[: len(captured.response_ids)] == captured.response_ids
        assert rendered.loss_mask[: len(captured.loss_mask)] == captured.loss_mask
        assert rendered.logprobs[: len(captured.logprobs)] == captured.logprobs  # aligned, so kept


def test_cut_rows_end_at_a_reply(run_dir, tmp_path, tokenizer):
    rows = _rows_of(run_dir, tmp_path / "full")
    limit = min(row["num_tokens"] for row in rows.values()) - 1
    out = tmp_path / "cut"
    result = export_run(
        run_dir, ExportOptions(fmt="tokens", out=str(out), max_length=limit, over_length="cut")
    )
    assert result.rows == result.cut == 6
    for row in _rows(out).values():
        assert row["num_tokens"] <= limit and row["cut"] and row["is_truncated"]
        assert row["response_ids"][-1] == tokenizer.eos_token_id and row["loss_mask"][-1] == 1
        assert len(row["logprobs"]) == len(row["response_ids"])


def _rows_of(run_dir, out):
    export_run(run_dir, ExportOptions(fmt="tokens", out=str(out)))
    return _rows(out)


def test_the_merged_parquet_keeps_the_captured_turns(run_dir):
    """data/*.parquet holds the turns' ids and logprobs typed, with the loss mask, under one schema."""
    ds = datasets.load_dataset("parquet", data_files=str(run_dir / "data" / "*.parquet"), split="train")
    records = kept_records(run_dir)
    for row in ds:
        record = records[row["id"]]
        assert row["loss_mask"] == record["loss_mask"]
        assert [t["token_ids"] for t in row["turns"]] == [t["token_ids"] for t in record["turns"]]
        assert [t["prompt_token_ids_from"] for t in row["turns"]] == [
            t["prompt_token_ids_from"] for t in record["turns"]
        ]
        if record["turns"][0]["logprobs"]:
            assert row["turns"][0]["logprobs"] == pytest.approx(record["turns"][0]["logprobs"])
            assert (
                row["turns"][0]["top_logprobs"][0][0]["token"]
                == record["turns"][0]["top_logprobs"][0][0]["token"]
            )
