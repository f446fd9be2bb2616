"""The report's Rewards section, from the statistics of a real merge."""

from __future__ import annotations

import json

from raygen.config import FilterConfig
from raygen.eval.rewards import rewards_section
from raygen.output.merge import merge_run
from tests.verify.test_merge_filters import write_run


def test_histogram_and_pass_at_k_per_category(tmp_path):
    write_run(tmp_path)
    merge_run(tmp_path, FilterConfig(), 100)
    stats = json.loads((tmp_path / "statistics.json").read_text())
    assert stats["verification"]["reward_histogram"] == [8, 0, 0, 0, 0, 1, 0, 0, 0, 8]
    html = rewards_section(stats)
    assert 'id="rewards"' in html and "<svg" in html
    assert all(f"pass@{k}" in html for k in (1, 2, 3, 4)) and ">py<" in html
    assert "No session" in rewards_section({"counts": {}})


def test_compare_gets_the_reward_figures(tmp_path):
    from raygen.eval.compare import bucket_metrics

    write_run(tmp_path)
    merge_run(tmp_path, FilterConfig(), 100)
    stats = json.loads((tmp_path / "statistics.json").read_text())
    metrics = bucket_metrics(stats)
    assert metrics["pass_rate"] == stats["verification"]["pass_rate"] and "pass@4" in metrics
    assert "mean_reward" not in bucket_metrics({"counts": {"total": 1}})  # runs without checks: unchanged
