"""merge_run end to end: shards written by ShardWriter -> data/ rejected/ failed/ statistics.json."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from raygen.config import FilterConfig
from raygen.formats.records import Trajectory
from raygen.output.merge import merge_run
from raygen.output.schema import SCHEMA
from raygen.output.shards import ShardWriter

TOOLS = ["terminal", "read_file", "web_search"]
LONG_PROMPT = "Explain this log line by line:\n" + "x" * 20_000
PER_SHARD = 4

# kind -> (outcome, reason) under the default filters (hallucinated + no_reasoning on, incomplete off),
# written from the spec of raygen.output.filters, not from its code.
EXPECTED_DEFAULT = {
    "good": ("kept", None),
    "hallucinated": ("rejected", "hallucinated_tool"),
    "no_reasoning": ("rejected", "no_reasoning"),
    "hallucinated_no_reasoning": ("rejected", "hallucinated_tool"),
    "max_turns": ("kept", None),
    "failed:rate_limited": ("failed", "rate_limited"),
    "failed:context_length": ("failed", "context_length"),
}


def trajectory(
    key: str, index: int, kind: str, *, attempt: int = 1, category: str | None = "code", **extra
) -> Trajectory:
    """A plausible record of the given kind (see EXPECTED_DEFAULT)."""
    prompt = extra.pop("prompt", f"task {index}: list the files")
    tool = TOOLS[index % len(TOOLS)]
    hallucinated = kind.startswith("hallucinated")
    reasoning = kind not in ("no_reasoning", "hallucinated_no_reasoning")
    failed = kind.startswith("failed:")
    called = "teleport" if hallucinated else tool
    messages = [
        {"role": "user", "content": prompt},
        {
            "role": "assistant",
            "content": "",
            **({"reasoning_content": "I should look first."} if reasoning else {}),
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": called, "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt b.txt ✓"},
        {"role": "assistant", "content": "Done: two files. 完成"},
    ]
    if failed:
        messages = messages[:1]
    tool_stats = {name: {"count": 0, "success": 0, "failure": 0} for name in TOOLS}
    if not failed and not hallucinated:
        tool_stats[tool] = {"count": 2, "success": 1, "failure": 1}
    errors = {"hallucinated": int(hallucinated), "invalid_arguments": 0, "execution": 0, "timeout": 0}
    if not failed and not hallucinated:
        errors["execution"] = 1
    return Trajectory(
        id=f"id-{key}",
        sample_key=key,
        prompt_index=index,
        attempt=attempt,
        category=category,
        metadata={"source": "unit", **({"extra": {"n": index}} if index % 2 else {"tags": ["a", "b"]})},
        conversations=[{"from": "human", "value": prompt}, {"from": "gpt", "value": "Done: two files. 完成"}],
        messages=messages,
        completed=kind not in ("max_turns",) and not failed,
        exit_status="max_turns"
        if kind == "max_turns"
        else kind.replace("failed:", "error:")
        if failed
        else "completed",
        error=f"{kind} after retries" if failed else None,
        api_calls=0 if failed else 2 + index % 3,
        toolsets_used=["terminal"],
        tools_offered=list(TOOLS),
        tool_stats=tool_stats,
        tool_error_counts=errors,
        hallucinated_tools=["teleport"] if hallucinated else [],
        reasoning={"with_reasoning": 1 if reasoning and not failed else 0, "without_reasoning": 1},
        usage={"prompt_tokens": 100 + index, "completion_tokens": 10 + index},
        timing={"duration_s": 0.5 + index / 10},
        model=extra.pop("model", "sim"),
        env={"backend": "fake"},
        **extra,
    )


def build_dataset() -> tuple[list[Trajectory], dict[str, str]]:
    """(records in write order, key -> kind of its final attempt)."""
    kinds = list(EXPECTED_DEFAULT)
    records, final_kind = [], {}
    for i in range(30):
        kind = kinds[i % len(kinds)]
        key = f"k{i:03d}"
        category = None if i % 5 == 0 else ("数学" if i % 2 else "code")
        prompt = LONG_PROMPT if i == 7 else f"task {i}: 列出文件 🚀"
        records.append(trajectory(key, i, kind, category=category, prompt=prompt))
        final_kind[key] = kind
    # Retries: a failed attempt then a successful one; a late failure never beats an earlier success;
    # all attempts failed -> the last attempt's kind.
    records.append(trajectory("r-ok", 30, "failed:rate_limited", attempt=1))
    records.append(trajectory("r-ok", 30, "good", attempt=2))
    records.append(trajectory("r-late-fail", 31, "good", attempt=1))
    records.append(trajectory("r-late-fail", 31, "failed:rate_limited", attempt=2))
    records.append(trajectory("r-all-fail", 32, "failed:rate_limited", attempt=1))
    records.append(trajectory("r-all-fail", 32, "failed:context_length", attempt=2))
    final_kind.update({"r-ok": "good", "r-late-fail": "good", "r-all-fail": "failed:context_length"})
    return records, final_kind


def write_shards(run_dir: Path, records: list[Trajectory], writers: int = 3) -> None:
    shard_writers = [
        ShardWriter(run_dir, f"node{w}-{w}-abcd{w}", max_records=5, flush_s=3600) for w in range(writers)
    ]
    for i, record in enumerate(records):
        shard_writers[i % writers].add(record.model_dump_json())
    for writer in shard_writers:
        writer.close()


def read_jsonl_dir(folder: Path, pattern: str) -> list[dict]:
    rows = []
    for path in sorted(folder.glob(pattern)):
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return rows


def outputs(run_dir: Path) -> tuple[list[dict], list[dict], list[dict]]:
    return (
        read_jsonl_dir(run_dir / "data", "train-*.jsonl"),
        read_jsonl_dir(run_dir / "rejected", "*.jsonl"),
        read_jsonl_dir(run_dir / "failed", "*.jsonl"),
    )


def tree_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture()
def run(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    records, final_kind = build_dataset()
    write_shards(tmp_path, records)
    # A torn temp file (crash mid-flush) and a garbage line must both be tolerated.
    (tmp_path / "shards" / "node9-000000.jsonl.tmp").write_text('{"sample_key": "k000", "prompt_in')
    (tmp_path / "shards" / "manual-000000.jsonl").write_text(
        "not json at all\n" + trajectory("k-extra", 40, "good").model_dump_json() + "\n"
    )
    final_kind["k-extra"] = "good"
    return tmp_path, final_kind


def test_accounting_and_filter_reasons(run):
    run_dir, final_kind = run
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    kept, rejected, failed = outputs(run_dir)

    assert result.keys == len(final_kind) == result.kept + result.rejected + result.failed
    assert (len(kept), len(rejected), len(failed)) == (result.kept, result.rejected, result.failed)
    all_keys = [r["sample_key"] for r in kept + rejected + failed]
    assert sorted(all_keys) == sorted(final_kind)  # each key exactly once

    for r in kept:
        assert EXPECTED_DEFAULT[final_kind[r["sample_key"]]] == ("kept", None)
    for r in rejected:
        assert EXPECTED_DEFAULT[final_kind[r["sample_key"]]] == ("rejected", r["rejection_reason"])
    for r in failed:
        assert EXPECTED_DEFAULT[final_kind[r["sample_key"]]] == ("failed", r["exit_status"].split(":", 1)[1])
        assert r["error"]

    by_key = {r["sample_key"]: r for r in kept + rejected + failed}
    assert by_key["r-ok"]["attempt"] == 2 and by_key["r-ok"]["exit_status"] == "completed"
    assert by_key["r-late-fail"]["attempt"] == 1 and by_key["r-late-fail"]["exit_status"] == "completed"
    assert by_key["r-all-fail"]["attempt"] == 2
    assert by_key["k007"]["conversations"][0]["value"] == LONG_PROMPT

    # data/ is ordered by prompt_index
    assert [r["prompt_index"] for r in kept] == sorted(r["prompt_index"] for r in kept)
    merge_info = result.stats["merge"]
    assert merge_info["unparseable_lines"] == result.unparseable_lines == 1
    assert merge_info["attempts_superseded"] == 3
    assert merge_info["records_read"] == 36 + 1
    assert merge_info["stale"] == 0


def test_parquet_shards_share_the_schema_and_match_jsonl(run):
    run_dir, _ = run
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    parquet = sorted((run_dir / "data").glob("train-*.parquet"))
    jsonl = sorted((run_dir / "data").glob("train-*.jsonl"))
    n = math.ceil(result.kept / PER_SHARD)
    assert n > 1 and len(parquet) == len(jsonl) == result.data_shards == n
    assert parquet[0].name == f"train-00000-of-{n:05d}.parquet"
    for p, j in zip(parquet, jsonl, strict=True):
        assert pq.read_schema(p).equals(SCHEMA)
        table = pq.read_table(p)
        rows = [json.loads(line) for line in j.read_text(encoding="utf-8").splitlines()]
        assert table.column("sample_key").to_pylist() == [r["sample_key"] for r in rows]
        # JSON-string columns decode back to the record's values
        assert [json.loads(m) for m in table.column("messages").to_pylist()] == [r["messages"] for r in rows]
        assert [json.loads(m) for m in table.column("tool_stats").to_pylist()] == [
            r["tool_stats"] for r in rows
        ]


def _load_with_datasets(tmp_path: Path, run_dirs: list[Path]) -> list[dict]:
    """Row counts as the ``datasets`` library sees them, in a fresh offline process with its own HF_HOME."""
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        import datasets
        out = []
        for d in sys.argv[1:]:
            data = Path(d) / "data"
            parquet = sorted(str(p) for p in data.glob("train-*.parquet"))
            jsonl = sorted(str(p) for p in data.glob("train-*.jsonl"))
            by_parquet = datasets.load_dataset("parquet", data_files=parquet, split="train")
            by_folder = datasets.load_dataset(str(data), split="train")
            row = {"parquet": by_parquet.num_rows, "folder": by_folder.num_rows,
                   "folder_columns": sorted(by_folder.column_names)}
            if any(Path(p).stat().st_size for p in jsonl):
                row["json"] = datasets.load_dataset("json", data_files=jsonl, split="train").num_rows
            if by_folder.num_rows:
                row["first_value"] = by_folder[0]["conversations"][0]["value"][:40]
            out.append(row)
        print(json.dumps(out))
        """
    )
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, run_dirs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_datasets_loads_outputs_offline(run, tmp_path_factory):
    run_dir, _ = run
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    # A run with zero kept records still yields one loadable (empty) shard.
    empty_dir = tmp_path_factory.mktemp("empty")
    write_shards(empty_dir, [trajectory("f1", 0, "failed:rate_limited"), trajectory("f2", 1, "hallucinated")])
    empty = merge_run(empty_dir, FilterConfig(), data_shard_records=PER_SHARD)
    assert empty.kept == 0
    assert [p.name for p in (empty_dir / "data").glob("*.parquet")] == ["train-00000-of-00001.parquet"]
    empty_table = pq.read_table(sorted(map(str, (empty_dir / "data").glob("train-*.parquet"))))
    assert empty_table.num_rows == 0 and empty_table.schema.equals(SCHEMA)
    # (``datasets`` 5.2 cannot build a zero-row split from files at all, so it is not asked here.)

    (full,) = _load_with_datasets(tmp_path_factory.mktemp("hf"), [run_dir])
    assert full["parquet"] == full["folder"] == full["json"] == result.kept
    assert "conversations" in full["folder_columns"] and "messages" in full["folder_columns"]
    assert full["first_value"].startswith("task ")


def test_statistics_reconcile_with_output_records(run):
    run_dir, _ = run
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    stats = json.loads((run_dir / "statistics.json").read_text(encoding="utf-8"))
    assert stats == json.loads(json.dumps(result.stats))
    kept, rejected, failed = outputs(run_dir)
    every = kept + rejected + failed

    counts = stats["counts"]
    assert counts["total"] == len(every) and counts["kept"] == len(kept)
    assert counts["rejected"] == dict(Counter(r["rejection_reason"] for r in rejected))
    assert counts["failed"] == dict(Counter(r["exit_status"].removeprefix("error:") for r in failed))
    assert stats["exit_statuses"] == dict(Counter(r["exit_status"] for r in every))

    for name in TOOLS:
        calls = sum(r["tool_stats"][name]["count"] for r in every)
        ok = sum(r["tool_stats"][name]["success"] for r in every)
        assert stats["tools"][name]["count"] == calls and stats["tools"][name]["success"] == ok
        assert stats["tools"][name]["success_rate"] == pytest.approx(ok / calls)
    assert stats["tool_errors"]["hallucinated"] == sum(len(r["hallucinated_tools"]) for r in every)

    with_r = sum(r["reasoning"]["with_reasoning"] for r in every)
    without_r = sum(r["reasoning"]["without_reasoning"] for r in every)
    assert stats["reasoning"]["turns_with"] == with_r
    assert stats["reasoning"]["coverage"] == pytest.approx(with_r / (with_r + without_r))
    assert stats["reasoning"]["sessions_with_any"] == sum(r["reasoning"]["with_reasoning"] > 0 for r in every)
    assert stats["api_calls"]["total"] == sum(r["api_calls"] for r in every)
    prompt = sum(r["usage"]["prompt_tokens"] for r in every)
    completion = sum(r["usage"]["completion_tokens"] for r in every)
    assert stats["tokens"] == {"prompt": prompt, "completion": completion, "total": prompt + completion}
    assert stats["duration_s"]["max"] == pytest.approx(max(r["timing"]["duration_s"] for r in every))

    per_cat = stats["per_category"]
    assert set(per_cat) == {r["category"] or "(none)" for r in every}
    assert sum(c["counts"]["total"] for c in per_cat.values()) == len(every)
    assert per_cat["数学"]["counts"]["total"] == sum(r["category"] == "数学" for r in every)
    assert "per_category" not in per_cat["code"]


def test_rerun_with_other_filters_changes_split_not_shards(run):
    run_dir, final_kind = run
    before = tree_digest(run_dir / "shards")
    first = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    second = merge_run(
        run_dir,
        FilterConfig(no_reasoning=False, hallucinated_tools=False, incomplete=True),
        data_shard_records=PER_SHARD,
    )
    assert tree_digest(run_dir / "shards") == before
    assert second.keys == first.keys and second.failed == first.failed
    kept, rejected, _ = outputs(run_dir)
    max_turns = sum(kind == "max_turns" for kind in final_kind.values())
    assert {r["rejection_reason"] for r in rejected} == {"incomplete"}
    assert len(rejected) == second.rejected == max_turns
    assert len(kept) == first.kept + first.rejected - max_turns
    # no stale data shards from the first merge, no temp folders
    assert len(list((run_dir / "data").glob("*.parquet"))) == math.ceil(second.kept / PER_SHARD)
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".merge")]


def test_expected_keys_restrict_the_merge(run):
    run_dir, _ = run
    wanted = {"k000", "k001", "r-ok", "never-ran"}
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD, expected_keys=wanted)
    kept, rejected, failed = outputs(run_dir)
    assert {r["sample_key"] for r in kept + rejected + failed} == wanted - {"never-ran"}
    assert result.missing == 1
    records_of_wanted = 1 + 1 + 2
    assert result.stale == result.records_read - records_of_wanted


def test_same_attempt_twice_later_shard_wins(tmp_path):
    early = ShardWriter(tmp_path, "a-writer", max_records=10, flush_s=3600)
    early.add(trajectory("dup", 0, "good", model="first").model_dump_json())
    early.close()
    late = ShardWriter(tmp_path, "b-writer", max_records=10, flush_s=3600)
    late.add(trajectory("dup", 0, "good", model="second").model_dump_json())
    late.close()
    os.utime(early.paths[0], ns=(1_000_000_000, 1_000_000_000))
    os.utime(late.paths[0], ns=(2_000_000_000, 2_000_000_000))
    merge_run(tmp_path, FilterConfig(), data_shard_records=10)
    assert [r["model"] for r in outputs(tmp_path)[0]] == ["second"]
    # swap the modification times: now the other shard is the later one
    os.utime(early.paths[0], ns=(3_000_000_000, 3_000_000_000))
    merge_run(tmp_path, FilterConfig(), data_shard_records=10)
    assert [r["model"] for r in outputs(tmp_path)[0]] == ["first"]


def test_crash_during_swap_leaves_each_folder_old_or_new(run, monkeypatch):
    run_dir, _ = run
    merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    old = {name: tree_digest(run_dir / name) for name in ("data", "rejected", "failed")}
    real_replace = os.replace
    calls = []

    def flaky_replace(src, dst):
        calls.append(Path(dst).name)
        # fail when the new rejected/ is about to be renamed into place (old one already moved away)
        if Path(dst).name == "rejected" and ".merge-" in str(src) and "old" not in Path(src).name:
            raise OSError("disk gone")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OSError, match="disk gone"):
        merge_run(run_dir, FilterConfig(no_reasoning=False, hallucinated_tools=False), data_shard_records=1)
    monkeypatch.setattr(os, "replace", real_replace)

    assert tree_digest(run_dir / "rejected") == old["rejected"]  # restored
    assert tree_digest(run_dir / "failed") == old["failed"]  # never swapped
    assert tree_digest(run_dir / "data") != old["data"]  # swapped before the crash, complete
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".merge")]
    # the next merge works normally
    result = merge_run(run_dir, FilterConfig(), data_shard_records=PER_SHARD)
    assert tree_digest(run_dir / "data") == old["data"] and result.keys > 0
