"""Tests for raygen.tools.distributions."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from raygen.errors import ConfigError
from raygen.input.validate import iter_samples
from raygen.tools.distributions import Distribution, builtin_distributions, load_distribution

KNOWN = {"terminal", "file"}
KEYS = [f"key-{i}" for i in range(4000)]


def expected_share(distribution: Distribution, available: list[str]) -> dict[str, float]:
    """Exact share (0-1) of samples offered each toolset, the at-least-one rule included."""
    probabilities = {k: v / 100 for k, v in distribution.probabilities(available).items()}
    if not probabilities:
        return {}
    none_came_up = math.prod(1 - p for p in probabilities.values())
    fallback = min(probabilities, key=lambda name: (-probabilities[name], name))
    return {name: p + (none_came_up if name == fallback else 0.0) for name, p in probabilities.items()}


def shares(draw, keys=KEYS, seed=0) -> dict[str, float]:
    counts: Counter[str] = Counter()
    for key in keys:
        counts.update(draw(seed, key))
    return {name: counts[name] / len(keys) for name in counts}


def test_draw_is_reproducible_and_sorted():
    first = load_distribution("light", KNOWN)
    second = load_distribution("light", KNOWN)
    draws = [first.draw(7, key) for key in KEYS[:300]]
    assert draws == [second.draw(7, key) for key in KEYS[:300]]
    assert all(d == sorted(d) for d in draws)
    assert draws != [first.draw(8, key) for key in KEYS[:300]]  # the run seed matters


def test_registering_another_toolset_keeps_existing_draws():
    # terminal at 100% keeps the at-least-one rule out of the way; file's coin must not move when
    # a new toolset is registered.
    dist = Distribution(name="d", toolsets={"*": 50, "terminal": 100})
    two = [dist.draw(1, key, ["file", "terminal"]) for key in KEYS[:300]]
    three = [dist.draw(1, key, ["file", "terminal", "web"]) for key in KEYS[:300]]
    assert [[t for t in d if t != "web"] for d in three] == two
    assert any("web" in d for d in three) and not all("web" in d for d in three)


def test_at_least_one_toolset_most_probable_then_alphabetical():
    light = load_distribution("light", KNOWN)
    assert all(light.draw(0, key) for key in KEYS)
    tie = Distribution(name="tie", toolsets={"b": 0, "a": 0, "c": 0})
    assert {tuple(tie.draw(0, key, ["c", "b", "a"])) for key in KEYS[:200]} == {("a",)}
    skewed = Distribution(name="skewed", toolsets={"a": 0, "b": 1, "c": 0})
    singles = {tuple(skewed.draw(0, key, ["a", "b", "c"])) for key in KEYS[:500]}
    assert singles == {("b",)}


def test_observed_frequencies_match_probabilities():
    # a 30%, b 60%, c 0%; none of a/b comes up with probability 0.7 * 0.4 = 0.28, then b (most probable).
    dist = Distribution(name="mix", toolsets={"a": 30, "b": 60, "c": 0})
    observed = shares(lambda seed, key: dist.draw(seed, key, ["a", "b", "c"]))
    assert observed["a"] == pytest.approx(0.30, abs=0.04)
    assert observed["b"] == pytest.approx(0.60 + 0.28, abs=0.04)
    assert "c" not in observed
    assert expected_share(dist, ["a", "b", "c"]) == pytest.approx({"a": 0.30, "b": 0.88, "c": 0.0})

    # Independence: both a and b come up in about 0.3 * 0.6 of samples.
    both = sum(dist.draw(0, key, ["a", "b", "c"]) == ["a", "b"] for key in KEYS) / len(KEYS)
    assert both == pytest.approx(0.18, abs=0.04)


def test_builtins_bind_and_behave_as_described():
    builtins = builtin_distributions()
    assert {"default", "terminal_only", "terminal_heavy", "file_heavy", "balanced", "light"} <= set(builtins)
    assert all(d.description for d in builtins.values())
    for name in builtins:
        load_distribution(name, KNOWN)
    everything = load_distribution("default", KNOWN | {"web"})
    assert {tuple(everything.draw(0, key)) for key in KEYS[:200]} == {("file", "terminal", "web")}
    heavy = shares(load_distribution("terminal_heavy", KNOWN).draw)
    assert heavy["terminal"] == 1.0
    assert heavy["file"] == pytest.approx(0.40, abs=0.04)


def test_wildcard_covers_unlisted_toolsets_only():
    dist = Distribution(name="w", toolsets={"*": 30, "terminal": 100})
    observed = shares(lambda seed, key: dist.draw(seed, key, ["file", "terminal", "web"]))
    assert observed["terminal"] == 1.0
    assert observed["file"] == pytest.approx(0.30, abs=0.04)
    assert observed["web"] == pytest.approx(0.30, abs=0.04)


def test_load_from_yaml_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("description: mostly files\ntoolsets: {file: 90, terminal: 10}\n")
    bound = load_distribution(str(path), KNOWN)
    assert bound.name == "mine"
    assert bound.probabilities() == {"file": 90, "terminal": 10}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("toolsets: {terminal: 150}", "less than or equal to 100"),
        ("toolsets: {terminal: -1}", "greater than or equal to 0"),
        ("toolsets: {browser: 50}", "unknown toolset.*browser.*registered toolsets: file, terminal"),
        ("toolset: {terminal: 50}", "toolset"),
        ("toolsets: {terminal: 0, file: 0}", "probability 0"),
        ("- just a list", "mapping"),
        ("toolsets: {terminal: [", "not valid YAML"),
    ],
)
def test_bad_distribution_files_raise_config_error(tmp_path, content, match):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_distribution(str(path), KNOWN)


def test_unknown_name_lists_builtins(tmp_path):
    with pytest.raises(ConfigError, match="built-ins: balanced, default, file_heavy"):
        load_distribution("no_such_thing", KNOWN)
    with pytest.raises(ConfigError, match="cannot read"):
        load_distribution(str(tmp_path / "missing.yaml"), KNOWN)
    with pytest.raises(ConfigError, match="unknown toolset"):
        load_distribution("terminal_only", {"terminal"})


def test_row_toolsets_override_distribution_in_iter_samples(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "pinned", "toolsets": ["file"]}] + [{"prompt": f"p{i}"} for i in range(50)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bound = load_distribution("file_heavy", KNOWN)
    samples = list(iter_samples(path, run_seed=5, distribution=bound))
    assert samples[0].toolsets == ["file"]
    assert all(s.toolsets == bound.draw(5, s.sample_key) for s in samples[1:])
    assert any("terminal" in s.toolsets for s in samples[1:])  # 30% over 50 rows: certain in practice
    assert all("file" in s.toolsets for s in samples[1:])
