"""summarize, classify and StatsAccumulator."""

from __future__ import annotations

import json
import pickle

import pytest

from raygen.config import FilterConfig
from raygen.formats.records import Trajectory
from raygen.output.filters import classify
from raygen.output.stats import StatsAccumulator
from raygen.output.summary import SessionSummary, summarize


def traj(key: str = "k", **fields) -> Trajectory:
    base = {
        "id": f"id-{key}",
        "sample_key": key,
        "prompt_index": 0,
        "completed": True,
        "reasoning": {"with_reasoning": 1, "without_reasoning": 1},
    }
    return Trajectory(**{**base, **fields})


def summary(**fields) -> SessionSummary:
    return summarize(traj(**fields))


def test_summary_is_the_same_from_a_trajectory_or_its_json():
    t = traj(
        category="c",
        attempt=3,
        api_calls=4,
        tool_stats={"terminal": {"count": 3, "success": 2, "failure": 1}},
        tool_error_counts={"execution": 1, "hallucinated": 2},
        hallucinated_tools=["a", "a"],
        usage={"prompt_tokens": 7, "completion_tokens": 5},
        timing={"duration_s": 2.5},
        messages=[{"role": "user", "content": "x" * 1000}],
    )
    from_model, from_json = summarize(t), summarize(json.loads(t.model_dump_json()))
    assert from_model == from_json
    assert from_model.tool_stats == {"terminal": {"count": 3, "success": 2, "failure": 1}}
    assert (from_model.hallucinated_calls, from_model.prompt_tokens, from_model.duration_s) == (2, 7, 2.5)
    assert pickle.loads(pickle.dumps(from_model)) == from_model
    assert SessionSummary.from_dict(json.loads(json.dumps(from_model.to_dict()))) == from_model


def test_hallucinations_count_from_either_field():
    assert summary(hallucinated_tools=["fly"]).hallucinated_calls == 1
    assert summary(tool_error_counts={"hallucinated": 2}).hallucinated_calls == 2
    assert summary().hallucinated_calls == 0


@pytest.mark.parametrize("bad", [{}, {"sample_key": "k"}, {"sample_key": "", "prompt_index": 1}, [1]])
def test_summarize_refuses_records_without_identity(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_classify_order_and_switches():
    all_on = FilterConfig(no_reasoning=True, hallucinated_tools=True, incomplete=True)
    everything_wrong = {
        "hallucinated_tools": ["fly"],
        "reasoning": {"with_reasoning": 0, "without_reasoning": 3},
        "completed": False,
        "exit_status": "max_turns",
    }
    assert classify(summary(**everything_wrong), all_on) == ("rejected", "hallucinated_tool")
    assert classify(summary(**everything_wrong), all_on.model_copy(update={"hallucinated_tools": False})) == (
        "rejected",
        "no_reasoning",
    )
    only_incomplete = FilterConfig(no_reasoning=False, hallucinated_tools=False, incomplete=True)
    assert classify(summary(**everything_wrong), only_incomplete) == ("rejected", "incomplete")
    none = FilterConfig(no_reasoning=False, hallucinated_tools=False, incomplete=False)
    assert classify(summary(**everything_wrong), none) == ("kept", None)
    # a failure is a failure whatever else is wrong with the session
    failed = summary(**{**everything_wrong, "exit_status": "error:env_lost"})
    assert classify(failed, all_on) == ("failed", "env_lost")
    assert classify(summary(), all_on) == ("kept", None)
    # defaults: incomplete sessions are kept
    assert classify(summary(completed=False, exit_status="max_turns"), FilterConfig()) == ("kept", None)


def sessions() -> list[tuple[SessionSummary, str, str | None]]:
    a = summary(
        key="a",
        category="x",
        api_calls=2,
        tool_stats={"t": {"count": 2, "success": 1, "failure": 1}, "u": {"count": 0}},
        usage={"prompt_tokens": 10, "completion_tokens": 1},
        timing={"duration_s": 1.0},
        reasoning={"with_reasoning": 2, "without_reasoning": 0},
    )
    b = summary(
        key="b",
        category="x",
        api_calls=4,
        tool_stats={"t": {"count": 3, "success": 3, "failure": 0}},
        tool_error_counts={"hallucinated": 1},
        hallucinated_tools=["ghost"],
        usage={"prompt_tokens": 20, "completion_tokens": 2},
        timing={"duration_s": 3.0},
        reasoning={"with_reasoning": 0, "without_reasoning": 2},
    )
    c = summary(
        key="c", exit_status="error:rate_limited", completed=False, api_calls=0, timing={"duration_s": 5}
    )
    return [(a, "kept", None), (b, "rejected", "hallucinated_tool"), (c, "failed", None)]


def test_statistics_by_hand():
    acc = StatsAccumulator()
    for s, outcome, reason in sessions():
        acc.add(s, outcome, reason)
    d = acc.to_dict()
    assert d["counts"] == {
        "total": 3,
        "kept": 1,
        "rejected": {"hallucinated_tool": 1},
        "failed": {"rate_limited": 1},
    }
    assert d["exit_statuses"] == {"completed": 2, "error:rate_limited": 1}
    assert d["tools"]["t"] == {"count": 5, "success": 4, "failure": 1, "success_rate": 0.8}
    assert d["tools"]["u"]["success_rate"] is None
    assert d["tool_errors"] == {"hallucinated": 1}
    # c has the default reasoning {1, 1}
    assert d["reasoning"] == {"turns_with": 3, "turns_without": 3, "sessions_with_any": 2, "coverage": 0.5}
    assert d["api_calls"] == {"total": 6, "mean_per_session": 2.0}
    assert d["tokens"] == {"prompt": 30, "completion": 3, "total": 33}
    assert d["duration_s"] == {"total": 9.0, "mean": 3.0, "max": 5.0}
    assert set(d["per_category"]) == {"x", "(none)"}
    assert d["per_category"]["x"]["counts"]["total"] == 2
    assert d["per_category"]["(none)"]["counts"]["failed"] == {"rate_limited": 1}
    assert "per_category" not in d["per_category"]["x"]
    json.dumps(d)  # statistics.json must be serializable


def test_merged_partials_equal_one_accumulator():
    whole, left, right = StatsAccumulator(), StatsAccumulator(), StatsAccumulator()
    for i, (s, outcome, reason) in enumerate(sessions() * 3):
        whole.add(s, outcome, reason)
        (left if i % 2 else right).add(s, outcome, reason)
    right = pickle.loads(pickle.dumps(right))  # partials cross Ray's object store
    left.merge(right)
    assert left.to_dict() == whole.to_dict()


def test_empty_accumulator_and_bad_outcome():
    d = StatsAccumulator().to_dict()
    assert d["counts"]["total"] == 0 and d["api_calls"]["mean_per_session"] is None
    assert d["reasoning"]["coverage"] is None and d["per_category"] == {}
    with pytest.raises(ValueError):
        StatsAccumulator().add(summary(), "maybe")
