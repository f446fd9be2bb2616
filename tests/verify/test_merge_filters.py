"""--min-reward, --groups and --best-of at the merge: each rejection with its own reason."""

from __future__ import annotations

import json

from raygen.config import FilterConfig
from raygen.formats.records import ReasoningCounts, Trajectory, Verification
from raygen.output.merge import merge_run
from raygen.output.shards import ShardWriter

# group -> rewards of its samples (None: verify_error, a failed sample)
GROUPS = {
    "mixed": [0.0, 1.0, 0.5, 1.0],  # best: index 1 (ties broken by the lowest index)
    "all_pass": [1.0, 1.0, 1.0, 1.0],  # uniform
    "all_fail": [0.0, 0.0, 0.0, 0.0],  # uniform
    "broken": [1.0, None, 0.0, 0.0],  # a failed sample: incomplete
    "short": [0.0, 1.0],  # two samples never ran: incomplete
}


def write_run(run_dir) -> None:
    writer = ShardWriter(run_dir, "test", 100, 60.0)
    for prompt_index, (group, rewards) in enumerate(GROUPS.items()):
        for index, reward in enumerate(rewards):
            failed = reward is None
            record = Trajectory(
                id=group,
                sample_key=f"{group}-{index}",
                prompt_index=prompt_index,
                category="py",
                completed=not failed,
                exit_status="error:verify_error" if failed else "completed",
                reasoning=ReasoningCounts(with_reasoning=1),
                group_id=group,
                sample_index=index,
                reward=reward,
                verification=Verification(passed=reward == 1.0, exit_code=0 if reward == 1.0 else 1),
            )
            writer.add(record.model_dump_json())
    writer.close()


def outcomes(run_dir, **filters) -> dict[str, str]:
    merge_run(run_dir, FilterConfig(**filters), 100)
    found = {}
    for folder, label in (("data", "kept"), ("rejected", None), ("failed", "failed")):
        for path in sorted((run_dir / folder).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                found[row["sample_key"]] = label or row["rejection_reason"]
    return found


def test_min_reward(tmp_path):
    write_run(tmp_path)
    got = outcomes(tmp_path, min_reward=0.5)
    assert got["mixed-0"] == "low_reward" and got["mixed-2"] == "kept" and got["mixed-3"] == "kept"
    assert got["broken-1"] == "failed"  # a check that could not run is a failure, not a low reward
    assert sum(v == "kept" for v in got.values()) == 9


def test_best_of_keeps_one_per_group_with_deterministic_ties(tmp_path):
    write_run(tmp_path)
    got = outcomes(tmp_path, best_of=True)
    kept = sorted(k for k, v in got.items() if v == "kept")
    assert kept == ["all_fail-0", "all_pass-0", "broken-0", "mixed-1", "short-1"]
    assert got["mixed-3"] == got["mixed-0"] == "not_best"
    stats = json.loads((tmp_path / "statistics.json").read_text())
    assert stats["counts"]["rejected"] == {"not_best": 12}
    # statistics count every sample: pass@k is about the generation, not the filtered dataset
    assert stats["verification"]["graded"] == 17 and stats["verification"]["verify_errors"] == 1


def test_groups_keep_complete_informative_groups(tmp_path):
    write_run(tmp_path)
    got = outcomes(tmp_path, groups=True)
    assert {k for k, v in got.items() if v == "kept"} == {f"mixed-{i}" for i in range(4)}
    assert got["all_pass-0"] == got["all_fail-3"] == "uniform_group"
    assert got["broken-0"] == got["short-1"] == "incomplete_group"


def test_merge_reapplies_other_filters_without_a_model(tmp_path):
    write_run(tmp_path)
    assert outcomes(tmp_path, best_of=True)["mixed-3"] == "not_best"
    assert outcomes(tmp_path)["mixed-3"] == "kept"  # the shards are untouched: filters can change
