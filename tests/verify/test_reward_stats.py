"""pass@k against brute-force enumeration, and the verification statistics of a merge."""

from __future__ import annotations

import itertools
from math import isclose

import pytest

from raygen.output.stats import StatsAccumulator
from raygen.output.summary import summarize
from raygen.output.verify_stats import pass_at_k


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    draws = list(itertools.combinations(outcomes, k))
    return sum(any(d) for d in draws) / len(draws)


@pytest.mark.parametrize(
    "outcomes", [[True], [False], [True, False, False, False], [False, True, True, False, False]]
)
def test_pass_at_k_is_the_chance_that_one_of_k_draws_passes(outcomes):
    n, c = len(outcomes), sum(outcomes)
    for k in range(1, n + 1):
        assert isclose(pass_at_k(n, c, k), brute_pass_at_k(outcomes, k))


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def record(
    key: str, group: str | None, index: int, reward: float | None, status: str = "completed", cat="py"
):
    verification = None if reward is None else {"passed": reward >= 1.0, "mode": "fresh"}
    return {
        "sample_key": key,
        "prompt_index": 0,
        "category": cat,
        "exit_status": status,
        "completed": status == "completed",
        "group_id": group,
        "sample_index": index,
        "reward": reward,
        "verification": verification,
    }


def test_statistics_per_category_and_overall():
    acc = StatsAccumulator()
    rows = [
        # group a: 1 of 4 passed; group b: 2 of 3 graded passed, 1 verify error (not a 0)
        *(record(f"a{i}", "a", i, r) for i, r in enumerate([1.0, 0.0, 0.0, 0.0])),
        *(record(f"b{i}", "b", i, r) for i, r in enumerate([1.0, 1.0, 0.0])),
        record("b3", "b", 3, None, status="error:verify_error"),
        record("c0", None, 0, 0.5, cat="sh"),  # a single sample: a group of one
        record("d0", None, 0, None, cat="sh"),  # no check at all
    ]
    for row in rows:
        s = summarize(row)
        acc.add(s, "failed" if s.failed else "kept")
    stats = acc.to_dict()
    py, overall = stats["per_category"]["py"]["verification"], stats["verification"]
    assert py["graded"] == 7 and py["passed"] == 3 and py["verify_errors"] == 1
    assert isclose(py["pass_rate"], 3 / 7) and isclose(py["mean_reward"], 3 / 7)
    assert isclose(py["error_share"], 1 / 8)
    assert set(py["pass_at_k"]) == {"1", "2", "3", "4"}
    assert isclose(py["pass_at_k"]["1"], (1 / 4 + 2 / 3) / 2)
    assert isclose(py["pass_at_k"]["3"], (pass_at_k(4, 1, 3) + 1.0) / 2)
    assert py["pass_at_k"]["4"] == pass_at_k(4, 1, 4) == 1.0  # only group a has 4 graded samples
    sh = stats["per_category"]["sh"]["verification"]
    assert sh["graded"] == 1 and sh["pass_at_k"] == {"1": 0.0} and sh["mean_reward"] == 0.5
    assert overall["graded"] == 8 and overall["groups"] == 3


def test_runs_without_checks_have_no_verification_key():
    acc = StatsAccumulator()
    acc.add(summarize(record("x", None, 0, None)), "kept")
    assert "verification" not in acc.to_dict()
