"""raygen sample: stratified, seeded, records unchanged, Markdown that hostile text cannot break."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import NASTY, NASTY_ID
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.config import FilterConfig
from raygen.eval.sample import parse_include, write_sample
from raygen.output.merge import merge_run


def read_sample(path: Path) -> list[dict]:
    # splitlines() on purpose: sample.jsonl must survive readers that also split at U+2028.
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run_records(run: Path) -> dict[str, dict]:
    records = {}
    for folder in ("data", "rejected", "failed"):
        for path in run.glob(f"{folder}/*.jsonl"):
            for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
                record = json.loads(line)
                records[record["sample_key"]] = record
    return records


def code_blocks(markdown: str) -> list[str]:
    """Fenced code blocks per CommonMark: a block closes only at a line of the same fence character at
    least as long as the opening fence (written from the spec, not from raygen's fence())."""
    blocks, current, fence = [], [], None
    for line in markdown.split("\n"):
        if fence is None:
            m = re.match(r"^(`{3,})", line)
            if m:
                fence, current = m.group(1), []
        elif re.fullmatch("`{" + str(len(fence)) + r",}\s*", line):
            blocks.append("\n".join(current))
            fence = None
        else:
            current.append(line)
    assert fence is None, "unclosed code block"
    return blocks


def test_kept_only_by_default_with_records_unchanged(small_run: Path, tmp_path: Path):
    result = write_sample(small_run, tmp_path / "s", per_category=3, seed=1)
    sample = read_sample(result.jsonl)
    originals = run_records(small_run)
    assert {r["review_sample"]["outcome"] for r in sample} == {"kept"}
    assert Counter(r["category"] for r in sample) == {"bash": 3, "sql": 3, "python": 3, "edge": 3}
    for record in sample:
        review = record.pop("review_sample")
        assert record == originals[record["sample_key"]]
        line = (small_run / review["file"]).read_text(encoding="utf-8").split("\n")[review["line"] - 1]
        assert json.loads(line)["sample_key"] == record["sample_key"]


def test_included_outcomes_are_their_own_strata(small_run: Path, tmp_path: Path):
    stats = json.loads((small_run / "statistics.json").read_text())
    result = write_sample(small_run, tmp_path, per_category=7, seed=2, include=["failed", "rejected"])
    sample = read_sample(result.jsonl)
    got = Counter((r["category"], r["review_sample"]["outcome"]) for r in sample)
    for category, bucket in stats["per_category"].items():
        counts = bucket["counts"]
        available = {
            "kept": counts["kept"],
            "rejected": sum(counts["rejected"].values()),
            "failed": sum(counts["failed"].values()),
        }
        for outcome, n in available.items():
            assert got[(category, outcome)] == min(7, n)
            assert result.population[(category, outcome)] == n
    reasons = {r["review_sample"]["reason"] for r in sample if r["review_sample"]["outcome"] == "rejected"}
    assert reasons == set(stats["counts"]["rejected"])
    assert all(
        r["rejection_reason"] == r["review_sample"]["reason"] for r in sample if "rejection_reason" in r
    )


def test_same_seed_same_sample_even_after_a_re_merge(make_run, tmp_path: Path):
    run = make_run("seeded", 200, nasty=False)
    first = write_sample(run, tmp_path / "a", per_category=4, seed=5, include=["rejected"])
    keys = [r["sample_key"] for r in read_sample(first.jsonl)]
    other_seed = write_sample(run, tmp_path / "b", per_category=4, seed=6, include=["rejected"])
    assert [r["sample_key"] for r in read_sample(other_seed.jsonl)] != keys
    merge_run(run, FilterConfig(), data_shard_records=7)  # the same records, cut into other files
    again = write_sample(run, tmp_path / "c", per_category=4, seed=5, include=["rejected"])
    assert [r["sample_key"] for r in read_sample(again.jsonl)] == keys
    assert again.markdown.read_text() == first.markdown.read_text()


def test_markdown_has_every_turn_and_keeps_hostile_text_inside_code(small_run: Path, tmp_path: Path):
    result = write_sample(small_run, tmp_path, per_category=40, seed=0, include=["failed"])
    markdown = result.markdown.read_text(encoding="utf-8")
    sample = read_sample(result.jsonl)
    assert len(re.findall(r"^## \d+\. ", markdown, re.M)) == len(sample)
    blocks = code_blocks(markdown)
    assert NASTY in blocks  # the whole prompt, verbatim, as one block
    outside = re.sub(r"^(`{3,}).*?^\1\s*$", "", markdown, flags=re.M | re.S)
    assert "</script>" not in outside and "<tool_call>" not in outside
    nasty = next(r for r in sample if r["id"] == NASTY_ID)
    tool_outputs = [json.loads(m["content"])["output"] for m in nasty["messages"] if m["role"] == "tool"]
    assert all(out in blocks for out in tool_outputs)
    assert "error:rate_limited" in markdown and "HTTP 429 after 8 retries" in blocks


def test_include_names_are_checked():
    assert parse_include("failed, rejected") == ("rejected", "failed")
    assert parse_include(None) == ()
    with pytest.raises(ValueError, match="kept"):
        parse_include("kept")


def test_cli(small_run: Path, tmp_path: Path):
    runner = CliRunner()
    args = ["sample", str(small_run), "--per-category", "2", "--seed", "3", "--include", "rejected,failed"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(read_sample(tmp_path / "sample.jsonl")) == 4 * 3 * 2
    assert (tmp_path / "sample.md").exists()
    bad = runner.invoke(app, ["sample", str(small_run), "--per-category", "2", "--include", "bogus"])
    assert bad.exit_code == 2 and "--include takes" in bad.output


def test_markup_in_record_fields_is_escaped():
    from conftest import make_trajectory

    from raygen.eval.markdown import trajectory_markdown

    record = make_trajectory(1, "good", "<img src=x onerror=alert(1)>*bold*").model_dump(mode="json")
    record["model"] = "<script>m</script>"
    markdown = trajectory_markdown(record, "kept", None, 1)
    outside = re.sub(r"^(`{3,}).*?^\1\s*$", "", markdown, flags=re.M | re.S)
    outside = re.sub(r"(`+).*?\1", "", outside)  # inline code spans
    assert not re.search(r"(?<!\\)<", outside)  # every < is backslash-escaped
    assert "\\<img" in outside and "\\<script" in outside and "\\*bold\\*" in outside
