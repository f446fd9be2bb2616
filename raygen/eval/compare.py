"""``raygen compare``: two runs' statistics side by side, refused when the runs are not like for like.

Two runs are comparable when what generated them matches: model, endpoint, sampling options and the
provider route (``sampling.extra_body``), max turns, system prompt, tool schemas, toolset distribution
(all from ``manifest["generation"]``) and the limits (``config.session``, ``config.governor``).
Anything else that differs (dataset, run seed, filters, environment) is reported but allowed. The
numbers all come from the two ``statistics.json`` files; no record is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygen.errors import ConfigError
from raygen.eval.html import ratio
from raygen.eval.runread import RunInfo, load_run
from raygen.output.verify_stats import verification_metrics

Getter = Callable[[dict[str, Any]], Any]


def _gen(key: str) -> Getter:
    return lambda m: (m.get("generation") or {}).get(key)


def _sampling(part: str) -> Getter:
    def get(manifest: dict[str, Any]) -> Any:
        sampling = dict((manifest.get("generation") or {}).get("sampling") or {})
        extra = sampling.pop("extra_body", None) or {}
        return extra if part == "extra_body" else sampling

    return get


def _config(section: str, drop: tuple[str, ...] = ()) -> Getter:
    def get(manifest: dict[str, Any]) -> Any:
        body = ((manifest.get("config") or {}).get(section)) or {}
        return {k: v for k, v in body.items() if k not in drop}

    return get


def _tool_names(manifest: dict[str, Any]) -> list[str]:
    schemas = (manifest.get("generation") or {}).get("tool_schemas") or []
    return sorted(((s or {}).get("function") or {}).get("name", "?") for s in schemas)


MUST_MATCH: tuple[tuple[str, Getter], ...] = (
    ("model", _gen("model")),
    ("model type", _gen("model_type")),
    ("endpoint", _gen("base_url")),
    ("provider route (sampling.extra_body)", _sampling("extra_body")),
    ("sampling", _sampling("rest")),
    ("max turns", _gen("max_turns")),
    ("system prompt", _gen("system_prompt")),
    ("tool schemas", _gen("tool_schemas")),
    ("toolset distribution", _gen("distribution")),
    # The prompt itself is compared resolved (above), not by file path; max_turns is above too.
    ("session limits", _config("session", drop=("system_prompt", "system_prompt_file", "max_turns"))),
    ("rate limits (governor)", _config("governor")),
)
INFORMATIONAL: tuple[tuple[str, Getter], ...] = (
    ("dataset", lambda m: (m.get("dataset") or {}).get("sha256")),
    ("run seed", _gen("seed")),
    ("filters", _config("filters")),
    ("environment", _config("env")),
    ("retry", _config("retry")),
)


@dataclass(frozen=True)
class Difference:
    """One setting that differs between run A and run B (values shortened for display)."""

    field: str
    run_a: Any
    run_b: Any

    def describe(self) -> str:
        return f"{self.field}: {brief(self.run_a)} vs {brief(self.run_b)}"

    def to_dict(self) -> dict[str, Any]:
        """As in ``raygen compare --json``: ``{"field", "a", "b"}``."""
        return {"field": self.field, "a": self.run_a, "b": self.run_b}


def brief(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _difference(name: str, a: Any, b: Any, a_manifest: dict, b_manifest: dict) -> Difference:
    if name == "tool schemas" and _tool_names(a_manifest) != _tool_names(b_manifest):
        return Difference(name, _tool_names(a_manifest), _tool_names(b_manifest))
    if name == "tool schemas":
        return Difference(name, "same tool names, different schemas", "(see manifest.json)")
    if isinstance(a, dict) and isinstance(b, dict):  # only the keys that differ
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return Difference(name, {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys})
    return Difference(name, a, b)


def _differences(checks: tuple[tuple[str, Getter], ...], a: dict, b: dict) -> list[Difference]:
    return [_difference(name, get(a), get(b), a, b) for name, get in checks if get(a) != get(b)]


def comparability_problems(a_manifest: dict[str, Any], b_manifest: dict[str, Any]) -> list[Difference]:
    """The ``MUST_MATCH`` settings that differ (empty: the runs are like for like)."""
    return _differences(MUST_MATCH, a_manifest, b_manifest)


class RunsNotComparable(ConfigError):
    """The runs differ in what generated them; ``problems`` lists how. ``--force`` compares anyway."""

    def __init__(self, a_name: str, b_name: str, problems: list[Difference]):
        super().__init__(a_name, b_name, problems)
        self.a_name, self.b_name, self.problems = a_name, b_name, problems

    def __str__(self) -> str:
        lines = [f"  {p.describe()}" for p in self.problems]
        return (
            f"runs {self.a_name} and {self.b_name} were generated differently, so their statistics are not "
            "like for like:\n" + "\n".join(lines) + "\npass --force to compare them anyway"
        )


def bucket_metrics(bucket: dict[str, Any]) -> dict[str, float | None]:
    """The comparable numbers of one statistics bucket (the whole run or one category)."""
    counts = bucket.get("counts") or {}
    total = int(counts.get("total") or 0)
    rejected = sum((counts.get("rejected") or {}).values())
    failed = sum((counts.get("failed") or {}).values())
    tokens = bucket.get("tokens") or {}
    reasoning = bucket.get("reasoning") or {}
    tools = (bucket.get("tools") or {}).values()
    calls = sum(t.get("count", 0) for t in tools)
    return {
        "sessions": total,
        "kept": int(counts.get("kept") or 0),
        "kept_rate": ratio(int(counts.get("kept") or 0), total),
        "rejected_rate": ratio(rejected, total),
        "failure_rate": ratio(failed, total),
        "model_calls_per_session": (bucket.get("api_calls") or {}).get("mean_per_session"),
        "tool_calls_per_session": ratio(calls, total),
        "tool_success_rate": ratio(sum(t.get("success", 0) for t in tools), calls),
        "tokens_total": tokens.get("total", 0),
        "tokens_per_session": ratio(tokens.get("total", 0), total),
        "prompt_tokens_per_session": ratio(tokens.get("prompt", 0), total),
        "completion_tokens_per_session": ratio(tokens.get("completion", 0), total),
        "reasoning_coverage": reasoning.get("coverage"),
        "sessions_with_reasoning_rate": ratio(reasoning.get("sessions_with_any", 0), total),
        "duration_mean_s": (bucket.get("duration_s") or {}).get("mean"),
        # Money (docs/cost.md): the final records' spend, per kept trajectory, and on what was not kept.
        "cost_usd": (bucket.get("cost") or {}).get("final_usd"),
        "cost_per_kept_usd": (bucket.get("cost") or {}).get("per_kept_usd"),
        "waste_usd": (bucket.get("cost") or {}).get("waste_usd"),
        **verification_metrics(bucket),
    }


def _pair(a: float | None, b: float | None) -> dict[str, float | None]:
    return {"a": a, "b": b, "delta": None if a is None or b is None else b - a}


def _pairs(
    a: dict[str, Any], b: dict[str, Any], default: float | None = None
) -> dict[str, dict[str, float | None]]:
    """``{key: {a, b, delta}}`` over both dicts' keys; a key one side lacks is ``default`` there."""
    return {k: _pair(a.get(k, default), b.get(k, default)) for k in dict.fromkeys([*a, *b])}


def _counts(bucket: dict[str, Any]) -> dict[str, int]:
    counts = bucket.get("counts") or {}
    rows = {f"rejected: {k}": v for k, v in sorted((counts.get("rejected") or {}).items())}
    rows.update({f"failed: {k}": v for k, v in sorted((counts.get("failed") or {}).items())})
    return rows


def _tools(bucket: dict[str, Any]) -> dict[str, dict[str, Any]]:
    total = int((bucket.get("counts") or {}).get("total") or 0)
    return {
        name: {
            "calls": t.get("count", 0),
            "calls_per_session": ratio(t.get("count", 0), total),
            "success_rate": t.get("success_rate"),
        }
        for name, t in (bucket.get("tools") or {}).items()
    }


def compare_documents(a: RunInfo, b: RunInfo, *, force: bool = False) -> dict[str, Any]:
    """The comparison of two loaded runs; raises ``RunsNotComparable`` unless ``force``."""
    problems = comparability_problems(a.manifest, b.manifest)
    if problems and not force:
        raise RunsNotComparable(a.name, b.name, problems)
    sa, sb = a.statistics, b.statistics
    ta, tb = _tools(sa), _tools(sb)
    cats_a, cats_b = sa.get("per_category") or {}, sb.get("per_category") or {}
    statuses_a, statuses_b = sa.get("exit_statuses") or {}, sb.get("exit_statuses") or {}
    total_a, total_b = bucket_metrics(sa)["sessions"] or 0, bucket_metrics(sb)["sessions"] or 0
    return {
        "runs": {"a": {"name": a.name, "dir": str(a.run_dir)}, "b": {"name": b.name, "dir": str(b.run_dir)}},
        "differences": [d.to_dict() for d in problems],
        "other_differences": [d.to_dict() for d in _differences(INFORMATIONAL, a.manifest, b.manifest)],
        "overview": {**_pairs(bucket_metrics(sa), bucket_metrics(sb)), **_pairs(_counts(sa), _counts(sb), 0)},
        "exit_statuses": {
            s: {
                **_pair(statuses_a.get(s, 0), statuses_b.get(s, 0)),
                "a_share": ratio(statuses_a.get(s, 0), total_a),
                "b_share": ratio(statuses_b.get(s, 0), total_b),
            }
            for s in sorted(set(statuses_a) | set(statuses_b))
        },
        "tools": {
            name: {
                key: _pair((ta.get(name) or {}).get(key), (tb.get(name) or {}).get(key))
                for key in ("calls", "calls_per_session", "success_rate")
            }
            for name in sorted(set(ta) | set(tb))
        },
        "tool_errors": _pairs(sa.get("tool_errors") or {}, sb.get("tool_errors") or {}, 0),
        "categories": {
            cat: _pairs(
                bucket_metrics(cats_a[cat]) if cat in cats_a else {},
                bucket_metrics(cats_b[cat]) if cat in cats_b else {},
            )
            for cat in sorted(set(cats_a) | set(cats_b))
        },
    }


def compare_runs(run_a: str | Path, run_b: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Load two run folders and compare them (see ``compare_documents``)."""
    return compare_documents(load_run(run_a), load_run(run_b), force=force)
