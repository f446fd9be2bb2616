"""The README's export end to end: a verified run with prompt groups on Ray through the CLI, capturing
token ids and logprobs from the simulator (rendering with the vendored tokenizer, as vLLM serving that
model would), then ``raygen export --to tokens --check``: one row per trajectory with its reward and group,
the server's ids, and a template check that agrees with them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest
from cli_runs import raygen_ok as raygen
from cli_runs import read_jsonl

from raygen.formats.chat_template import load_tokenizer, render_text
from raygen.output.hermes import offered_schemas

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = str(ROOT / "tests" / "data" / "tiny-chat-tokenizer")
ROWS = 3
SAMPLES = 4


def test_verified_run_exports_token_rows_with_rewards_and_groups(tmp_path):
    run_args = ["run", "examples/verified/verified.jsonl", "-c", "examples/verified/sim.yaml"]
    run_args += ["--samples-per-prompt", str(SAMPLES), "--limit", str(ROWS), "--workers", "1"]
    run_args += ["--output-dir", str(tmp_path), "--run-name", "rl"]
    run_args += ["-c", "sampling.return_token_ids=true", "-c", "sampling.logprobs=true"]
    run_args += ["-c", f"sim.tokenizer={TOKENIZER}"]
    raygen(*run_args)
    run_dir, out = tmp_path / "rl", tmp_path / "rl-tokens"
    kept = {r["id"] + "/" + str(r["sample_index"]): r for r in read_jsonl(run_dir.glob("data/*.jsonl"))}
    assert len(kept) == ROWS * SAMPLES  # the simulator's sessions pass every default filter
    assert all(r["turns"] and r["turns"][0]["token_ids"] for r in kept.values())

    done = raygen(
        "export", str(run_dir), "--to", "tokens", "--out", str(out), "--tokenizer", TOKENIZER, "--check"
    )
    assert f"{len(kept)} rows of {len(kept)} records" in done.stderr
    assert f"token ids: {len(kept)} captured" in done.stderr
    check = json.loads((out / "template_check.json").read_text())
    assert check["server_ids"]["compared"] == check["server_ids"]["matched"] == len(kept)

    ds = datasets.load_dataset(str(out), split="train")
    assert ds.num_rows == len(kept)
    groups = Counter(row["group_id"] for row in ds)
    assert len(groups) == ROWS and set(groups.values()) == {SAMPLES}
    assert {row["reward"] for row in ds} <= {0.0, 1.0} and all(row["reward"] is not None for row in ds)
    tokenizer = load_tokenizer(TOKENIZER)
    for row in ds:
        record = kept[row["id"] + "/" + str(row["sample_index"])]
        assert row["reward"] == record["reward"] and row["group_id"] == record["group_id"]
        tools = [{"type": "function", "function": s} for s in offered_schemas(record)]
        full = render_text(tokenizer, record["messages"], tools, generation_prompt=False)
        assert tokenizer.decode(row["prompt_ids"] + row["response_ids"]) + "\n" == full
        assert len(row["logprobs"]) == len(row["loss_mask"]) == len(row["response_ids"])
        assert sum(row["loss_mask"]) == sum(len(t["token_ids"]) for t in record["turns"])
