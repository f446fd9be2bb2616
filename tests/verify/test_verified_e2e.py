"""The README's verified run from the command line, on Ray, against the simulator over HTTP: ``raygen run
examples/verified/verified.jsonl -c examples/verified/sim.yaml --samples-per-prompt 4 --best-of``.

One flow: a run with 2 samples per prompt, resumed with 4 (only the missing samples of each group run),
best-of at the merge, pass@k per category in statistics.json and the summary, the hidden tests in no
record, ``raygen merge --groups`` re-applying filters, ``raygen rescore`` reproducing every reward.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from cli_runs import raygen_ok as raygen
from cli_runs import read_jsonl

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verified"
ROWS = 6


def all_records(run: Path) -> list[dict]:
    return read_jsonl([*run.glob("data/*.jsonl"), *run.glob("rejected/*.jsonl"), *run.glob("failed/*.jsonl")])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("verified")
    common = ["-c", "examples/verified/sim.yaml", "--best-of", "--limit", str(ROWS), "--output-dir", str(out)]
    common += ["--run-name", "v", "--workers", "1", "--sessions-per-worker", "8"]
    first = raygen("run", "examples/verified/verified.jsonl", *common, "--samples-per-prompt", "2")
    second = raygen(
        "run", "examples/verified/verified.jsonl", *common, "--samples-per-prompt", "4", "--resume"
    )
    return out / "v", first, second


def test_a_resume_runs_exactly_the_missing_samples_of_each_group(run):
    run_dir, first, second = run
    assert f"{ROWS * 2} samples, 0 already done, {ROWS * 2} to run" in first.stderr
    assert f"{ROWS * 4} samples, {ROWS * 2} already done, {ROWS * 2} to run" in second.stderr
    records = all_records(run_dir)
    groups = defaultdict(list)
    for r in records:
        groups[r["group_id"]].append(r["sample_index"])
    assert len(records) == ROWS * 4 and all(sorted(v) == [0, 1, 2, 3] for v in groups.values())
    assert len({r["sample_key"] for r in records}) == ROWS * 4


def test_best_of_keeps_the_best_verified_sample_per_prompt(run):
    run_dir, _, second = run
    kept = read_jsonl(run_dir.glob("data/*.jsonl"))
    rejected = read_jsonl(run_dir.glob("rejected/*.jsonl"))
    assert len(kept) == ROWS and {r["rejection_reason"] for r in rejected} == {"not_best"}
    by_group = defaultdict(list)
    for r in kept + rejected:
        by_group[r["group_id"]].append(r)
    for r in kept:
        group = by_group[r["group_id"]]
        best = max(g["reward"] for g in group)
        assert r["reward"] == best
        # ties go to the lowest sample index
        assert r["sample_index"] == min(g["sample_index"] for g in group if g["reward"] == best)
        assert r["verification"]["passed"] == (r["reward"] == 1.0)
        assert r["artifacts"][0]["path"] == "solution.py"
    rewards = {r["reward"] for r in kept + rejected}
    assert rewards == {0.0, 1.0}  # the simulator solved some tasks and failed others
    assert "pass@4" in second.stderr and "mean reward" in second.stderr


def test_statistics_have_pass_at_k_per_category(run):
    run_dir, _, _ = run
    stats = json.loads((run_dir / "statistics.json").read_text())
    records = all_records(run_dir)
    v = stats["verification"]
    assert v["graded"] == ROWS * 4 and v["verify_errors"] == 0
    assert v["pass_rate"] == sum(r["reward"] == 1.0 for r in records) / len(records)
    assert set(v["pass_at_k"]) == {"1", "2", "3", "4"}
    assert v["pass_at_k"]["1"] <= v["pass_at_k"]["2"] <= v["pass_at_k"]["4"]
    solved_groups = {r["group_id"] for r in records if r["reward"] == 1.0}
    assert v["pass_at_k"]["4"] == len(solved_groups) / ROWS  # pass@n: did any sample of the group pass
    assert set(stats["per_category"]) == {"python"} and stats["per_category"]["python"]["verification"]


def test_the_model_never_saw_the_hidden_tests(run):
    run_dir, _, _ = run
    rows = [json.loads(line) for line in (EXAMPLE / "verified.jsonl").read_text().splitlines()][:ROWS]
    # What the model saw and said, and what the agent left (verification.output may quote a failing test's
    # line in its traceback: it is the check's log, written after the session, not part of the conversation).
    seen = [{k: r[k] for k in ("messages", "conversations", "artifacts")} for r in all_records(run_dir)]
    text = json.dumps(seen)
    for row in rows:
        hidden = row["verify"]["files"]["test_hidden.py"]
        lines = [line for line in hidden.splitlines() if line.strip().startswith("assert") and len(line) > 24]
        assert lines and not any(json.dumps(line)[1:-1] in text for line in lines)


def test_merge_reapplies_filters_and_rescore_reproduces_the_rewards(run):
    run_dir, _, _ = run
    before = {r["sample_key"]: r["reward"] for r in all_records(run_dir)}
    raygen("merge", str(run_dir), "--no-best-of", "--groups")
    reasons = {r["rejection_reason"] for r in read_jsonl(run_dir.glob("rejected/*.jsonl"))}
    kept = read_jsonl(run_dir.glob("data/*.jsonl"))
    assert reasons <= {"uniform_group"} and all(
        len({r["group_id"] for r in kept}) * 4 == len(kept) for _ in [0]
    )
    done = raygen("rescore", str(run_dir))
    assert f"rescored {ROWS * 4} sessions: 0 changed" in done.stderr
    assert {r["sample_key"]: r["reward"] for r in all_records(run_dir)} == before


def test_a_check_that_times_out_is_retried_and_never_a_zero(tmp_path):
    rows = [json.loads(line) for line in (EXAMPLE / "verified.jsonl").read_text().splitlines()][:2]
    for row in rows:
        row["verify"] = {**row["verify"], "command": "sleep 30", "timeout_s": 0.5}
    dataset = tmp_path / "slow-checks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["-c", "examples/verified/sim.yaml", "--output-dir", str(tmp_path), "--run-name", "t"]
    raygen(
        "run", str(dataset), *common, "--max-attempts", "2", "-c", "retry.pass_delay_s=0", "--workers", "1"
    )
    run_dir = tmp_path / "t"
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["counts"]["failed"] == {"verify_error": 2}
    v = stats["verification"]
    assert (v["graded"], v["verify_errors"], v["mean_reward"], v["pass_at_k"]) == (0, 2, None, {})
    attempts = read_jsonl(run_dir.glob("shards/*.jsonl"))
    assert sorted(r["attempt"] for r in attempts) == [1, 1, 2, 2]  # retried per the policy
    assert all(r["reward"] is None and "timed out" in r["error"] for r in attempts)
