"""raygen compare: side-by-side numbers from statistics.json, refused for runs generated differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.eval.compare import RunsNotComparable, comparability_problems, compare_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A baseline, a like-for-like run on other prompts, and one run per setting that must match."""
    from conftest import CATEGORIES, build_run

    root = tmp_path_factory.mktemp("cmp")
    variants = {
        "base": ({}, {}),
        # Same generation, other dataset and seed, only three categories, different filters: allowed.
        "same": ({"seed": 9, "filters": {"incomplete": True}}, {"categories": CATEGORIES[:3]}),
        "model": ({"model": {"type": "sim", "model": "other-model"}}, {}),
        "route": ({"sampling": {"extra_body": {"provider": {"order": ["deepinfra"]}}}}, {}),
        "temperature": ({"sampling": {"temperature": 0.2}}, {}),
        "turns": ({"session": {"max_turns": 4}}, {}),
        "timeout": ({"session": {"command_timeout_s": 5.0}}, {}),
        "governor": ({"governor": {"rpm": 120}}, {}),
        "tools": ({"tools": {"distribution": "light"}}, {}),
        "prompt": ({"session": {"system_prompt": "Be terse."}}, {}),
    }
    return {
        name: build_run(root, name, 24 if name != "same" else 30, config=config, nasty=False, **kw)
        for name, (config, kw) in variants.items()
    }


EXPECTED_FIELD = {
    "model": "model",
    "route": "provider route (sampling.extra_body)",
    "temperature": "sampling",
    "turns": "max turns",
    "timeout": "session limits",
    "governor": "rate limits (governor)",
    "prompt": "system prompt",
    "tools": "toolset distribution",
}


@pytest.mark.parametrize("variant", sorted(EXPECTED_FIELD))
def test_each_generation_setting_must_match(runs: dict[str, Path], variant: str):
    with pytest.raises(RunsNotComparable) as info:
        compare_runs(runs["base"], runs[variant])
    fields = [p.field for p in info.value.problems]
    assert fields == [EXPECTED_FIELD[variant]]
    assert "--force" in str(info.value)
    forced = compare_runs(runs["base"], runs[variant], force=True)
    assert [d["field"] for d in forced["differences"]] == fields


def test_like_for_like_runs_compare_side_by_side(runs: dict[str, Path]):
    doc = compare_runs(runs["base"], runs["same"])
    sa = json.loads((runs["base"] / "statistics.json").read_text())
    sb = json.loads((runs["same"] / "statistics.json").read_text())
    assert doc["differences"] == []
    assert {d["field"] for d in doc["other_differences"]} == {"run seed", "filters"}
    sessions = doc["overview"]["sessions"]
    assert (sessions["a"], sessions["b"]) == (sa["counts"]["total"], sb["counts"]["total"])
    assert sessions["delta"] == sb["counts"]["total"] - sa["counts"]["total"]
    tokens = doc["overview"]["tokens_per_session"]
    assert tokens["a"] == pytest.approx(sa["tokens"]["total"] / sa["counts"]["total"])
    for tool, stat in sa["tools"].items():
        assert doc["tools"][tool]["calls"]["a"] == stat["count"]
        assert doc["tools"][tool]["success_rate"]["b"] == sb["tools"][tool]["success_rate"]
    for status in set(sa["exit_statuses"]) | set(sb["exit_statuses"]):
        assert doc["exit_statuses"][status]["b"] == sb["exit_statuses"].get(status, 0)
    # "edge" is only in run A: its B side is empty, not an error.
    assert doc["categories"]["edge"]["sessions"]["b"] is None
    assert doc["categories"]["bash"]["kept_rate"]["a"] == pytest.approx(
        sa["per_category"]["bash"]["counts"]["kept"] / sa["per_category"]["bash"]["counts"]["total"]
    )
    for reason, n in sb["counts"]["rejected"].items():
        assert doc["overview"][f"rejected: {reason}"]["b"] == n


def test_cli_tables_json_and_refusal(runs: dict[str, Path]):
    runner = CliRunner()
    ok = runner.invoke(app, ["compare", str(runs["base"]), str(runs["same"])], terminal_width=200)
    assert ok.exit_code == 0, ok.output
    for text in ("overview", "terminal", "read_file", "bash", "edge", "kept_rate", "error:rate_limited"):
        assert text in ok.output
    as_json = runner.invoke(app, ["compare", str(runs["base"]), str(runs["same"]), "--json"])
    assert json.loads(as_json.output)["runs"]["b"]["name"] == "same"
    refused = runner.invoke(app, ["compare", str(runs["base"]), str(runs["route"])])
    assert refused.exit_code == 2
    assert "provider route" in refused.output and "--force" in refused.output
    forced = runner.invoke(app, ["compare", str(runs["base"]), str(runs["route"]), "--force"])
    assert forced.exit_code == 0 and "differs (compared anyway)" in forced.output


def test_tool_schema_changes_are_named(runs: dict[str, Path]):
    base = json.loads((runs["base"] / "manifest.json").read_text())
    reworded = json.loads(json.dumps(base))
    reworded["generation"]["tool_schemas"][0]["function"]["description"] += " Now different."
    (problem,) = comparability_problems(base, reworded)
    assert problem.field == "tool schemas" and "same tool names" in problem.describe()
    fewer = json.loads(json.dumps(base))
    dropped = fewer["generation"]["tool_schemas"].pop()["function"]["name"]
    (problem,) = comparability_problems(base, fewer)
    assert dropped in problem.run_a and dropped not in problem.run_b
