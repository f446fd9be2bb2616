"""A template that re-renders history (drops earlier replies' reasoning, as Qwen3's does across user
turns): the server's prompts no longer extend each other, so a trajectory is not one token sequence. One
row per model call (``--token-rows turn``) is still exact, and the check compares turn by turn."""

from __future__ import annotations

import asyncio
import json
import shutil

import datasets
import pytest

from raygen.config import SimConfig
from raygen.export.run import ExportOptions, export_run
from raygen.export.tokens import NOT_EXTENDING
from raygen.formats.chat_template import load_tokenizer, render_ids
from raygen.output.hermes import offered_schemas
from raygen.sim.server import SimServer
from tests.export.conftest import CAPTURE, PROMPTS, TOKENIZER, _sample, _sessions, kept_records, write_run


@pytest.fixture(scope="module")
def forgetful(tmp_path_factory):
    """A copy of the test tokenizer whose template shows reasoning only in the last message."""
    folder = tmp_path_factory.mktemp("forgetful") / "tokenizer"
    shutil.copytree(TOKENIZER, folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    old = "{%- if message.reasoning_content %}"
    assert old in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        old, "{%- if message.reasoning_content and loop.last %}"
    )
    path.write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def forgetful_run(tmp_path_factory, forgetful):
    async def generate():
        cfg = SimConfig(latency_s=0.0, tokenizer=forgetful, reasoning_style="field", no_reasoning_rate=0.0)
        async with SimServer(cfg) as sim:
            return await _sessions(
                sim.url, CAPTURE, [_sample(i, p, group=True) for i, p in enumerate(PROMPTS[:4])]
            )

    return write_run(tmp_path_factory.mktemp("forgetful-run") / "run", asyncio.run(generate()))


def _tools(record):
    return [{"type": "function", "function": s} for s in offered_schemas(record)]


def test_prompts_that_do_not_extend_are_stored_whole(forgetful_run):
    for record in kept_records(forgetful_run).values():
        assert [t["prompt_token_ids_from"] for t in record["turns"]][1:] == [0] * (len(record["turns"]) - 1)


def test_a_trajectory_row_is_refused_and_turn_rows_are_exact(forgetful_run, forgetful, tmp_path):
    whole = export_run(
        forgetful_run, ExportOptions(fmt="tokens", out=str(tmp_path / "whole"), tokenizer=forgetful)
    )
    assert whole.rows == 0
    assert whole.skipped == {NOT_EXTENDING + " and the template failed": 4}
    out = tmp_path / "turns"
    result = export_run(forgetful_run, ExportOptions(fmt="tokens", out=str(out), token_rows="turn"))
    records = kept_records(forgetful_run)
    assert result.rows == sum(len(r["turns"]) for r in records.values()) and result.sources == {
        "captured": result.rows
    }
    tokenizer = load_tokenizer(forgetful)
    ds = datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train")
    for row in ds:
        record = records[row["id"]]
        assistants = [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"]
        index = assistants[row["turn"]]
        # the prompt is what the template renders for the conversation before the reply
        before = render_ids(tokenizer, record["messages"][:index], _tools(record), generation_prompt=True)
        assert row["prompt_ids"] == before
        assert row["response_ids"] == record["turns"][row["turn"]]["token_ids"]
        assert row["loss_mask"] == [1] * len(row["response_ids"])
        assert row["logprobs"] == pytest.approx(record["turns"][row["turn"]]["logprobs"])
        assert row["group_id"] == record["group_id"]


def test_the_check_compares_turn_by_turn(forgetful_run, forgetful, tmp_path):
    """Rendered per turn, the forgetful template gives exactly the server's ids; the standard template
    (which keeps reasoning in history) differs from the second prompt on."""
    same = export_run(
        forgetful_run, ExportOptions(fmt="trl", out=str(tmp_path / "a"), tokenizer=forgetful, check=True)
    )
    assert same.check["render_failures"] == 4  # not one sequence: a trajectory cannot be rendered whole
    other = export_run(
        forgetful_run, ExportOptions(fmt="trl", out=str(tmp_path / "b"), tokenizer=TOKENIZER, check=True)
    )
    served = other.check["server_ids"]
    assert served["compared"] == served["mismatched"] == 4
    assert {(e["turn"], e["part"]) for e in served["mismatch_examples"]} == {(1, "prompt")}


def test_turn_rows_of_a_consistent_run(run_dir, tmp_path, tokenizer):
    out = tmp_path / "turns"
    result = export_run(
        run_dir, ExportOptions(fmt="tokens", out=str(out), token_rows="turn", tokenizer=TOKENIZER)
    )
    records = kept_records(run_dir)
    assert result.rows == sum(r["api_calls"] for r in records.values())
    assert result.sources == {"captured": result.rows - 6, "rendered": 6}  # two records of 3 turns uncaptured
    ds = datasets.load_dataset("parquet", data_files=str(out / "*.parquet"), split="train")
    for row in ds:
        record = records[row["id"]]
        full = render_ids(tokenizer, record["messages"], _tools(record), generation_prompt=False)
        assert full[: row["num_tokens"]] == row["prompt_ids"] + row["response_ids"]
