"""Run statistics: a mergeable accumulator of session summaries and the body of ``statistics.json``.

``StatsAccumulator.to_dict()`` keys (every session counts: kept, rejected and failed alike, unless said):

- ``counts``: ``total`` sessions; ``kept``; ``rejected`` ``{reason: n}``; ``failed`` ``{kind: n}``
  (reasons and kinds as in ``raygen.output.filters``).
- ``exit_statuses``: ``{exit_status: n}``, e.g. ``completed``, ``max_turns``, ``error:rate_limited``.
- ``tools``: ``{tool: {count, success, failure, success_rate}}`` summed over the records' ``tool_stats``;
  ``success_rate`` is ``success / count`` (null for a tool that was offered but never called).
- ``tool_errors``: ``{kind: n}`` summed ``tool_error_counts`` (``hallucinated``, ``invalid_arguments``,
  ``execution``, ``timeout``).
- ``reasoning``: ``turns_with`` / ``turns_without`` assistant turns with/without reasoning;
  ``sessions_with_any`` sessions with at least one reasoning turn; ``coverage`` =
  ``turns_with / (turns_with + turns_without)`` (null when there were no assistant turns).
- ``api_calls``: ``total`` model calls and ``mean_per_session`` (null with no sessions).
- ``tokens``: ``prompt``, ``completion`` and ``total`` tokens as reported by the provider.
- ``cost``: USD of the final records: ``final_usd``, by outcome ``kept_usd`` / ``rejected_usd`` /
  ``failed_usd``, ``waste_usd`` (rejected + failed), ``per_kept_usd`` (final spend / kept),
  ``failed_by_kind_usd``, ``by_source`` ``{cost_source: sessions}``, ``unpriced_sessions``; the merge
  adds ``total_usd`` (every attempt ever recorded, superseded ones and resumed passes included) and
  ``superseded_usd``.
- ``duration_s``: ``total``, ``mean`` (null with no sessions) and ``max`` session wall time.
- ``safety``: ``labels`` ``{label: n}`` tool calls matched by the unsafe-action rules (one per matching
  rule, see ``raygen/safety``) and ``sessions_with_labels``.
- ``verification`` (only when some session had a check): ``graded`` sessions (the check gave a reward),
  ``passed``, ``pass_rate``, ``mean_reward``, ``verify_errors`` (checks that could not run; never counted
  as 0), ``error_share`` (of checked sessions), ``groups`` and ``pass_at_k`` ``{"1": ..., "K": ...}``, the
  unbiased estimator averaged over prompt groups (``raygen.output.verify_stats``).
- ``per_category``: ``{category: {...}}`` with all the keys above except ``per_category``; sessions
  without a category are under ``"(none)"``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raygen.errors import failure_kind
from raygen.output.filters import FAILED, KEPT, OUTCOMES, REJECTED
from raygen.output.summary import SessionSummary
from raygen.output.verify_stats import VerificationStats

NO_CATEGORY = "(none)"


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _add_counts(counter: Counter, counts: dict[str, int]) -> None:
    """``counter.update(counts)`` for a plain dict, without its type checks: run per record by the merge,
    and these dicts are mostly empty."""
    for key, count in counts.items():
        counter[key] += count


@dataclass
class _Bucket:
    """Sums for one group of sessions (the whole run or one category)."""

    total: int = 0
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    exit_statuses: Counter = field(default_factory=Counter)
    tools: dict[str, list[int]] = field(default_factory=dict)
    """``{tool: [count, success, failure]}``."""
    tool_errors: Counter = field(default_factory=Counter)
    turns_with: int = 0
    turns_without: int = 0
    sessions_with_any: int = 0
    api_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_total: float = 0.0
    duration_max: float = 0.0
    cost_by_outcome: Counter = field(default_factory=Counter)
    cost_failed: Counter = field(default_factory=Counter)
    cost_sources: Counter = field(default_factory=Counter)
    safety_labels: Counter = field(default_factory=Counter)
    sessions_with_labels: int = 0
    verification: VerificationStats = field(default_factory=VerificationStats)

    def add(self, s: SessionSummary, outcome: str, reason: str | None) -> None:
        self.total += 1
        self.verification.add(s.exit_status, s.reward, s.passed, s.group_id)
        if outcome == KEPT:
            self.kept += 1
        elif outcome == REJECTED:
            self.rejected[reason or "unknown"] += 1
        else:
            self.failed[reason or failure_kind(s.exit_status) or "unknown"] += 1
        self.exit_statuses[s.exit_status] += 1
        for name, stat in s.tool_stats.items():
            sums = self.tools.setdefault(name, [0, 0, 0])
            sums[0] += stat.get("count", 0)
            sums[1] += stat.get("success", 0)
            sums[2] += stat.get("failure", 0)
        _add_counts(self.tool_errors, s.tool_error_counts)
        self.turns_with += s.reasoning_with
        self.turns_without += s.reasoning_without
        self.sessions_with_any += s.reasoning_with > 0
        self.api_calls += s.api_calls
        self.prompt_tokens += s.prompt_tokens
        self.completion_tokens += s.completion_tokens
        self.duration_total += s.duration_s
        self.duration_max = max(self.duration_max, s.duration_s)
        self.cost_by_outcome[outcome] += s.cost_usd
        if outcome == FAILED:
            self.cost_failed[reason or failure_kind(s.exit_status) or "unknown"] += s.cost_usd
        self.cost_sources[s.cost_source or "none"] += 1
        _add_counts(self.safety_labels, s.safety_labels)
        self.sessions_with_labels += bool(s.safety_labels)

    def merge(self, o: _Bucket) -> None:
        self.total += o.total
        self.kept += o.kept
        for mine, theirs in (
            (self.rejected, o.rejected),
            (self.failed, o.failed),
            (self.exit_statuses, o.exit_statuses),
            (self.tool_errors, o.tool_errors),
            (self.safety_labels, o.safety_labels),
            (self.cost_by_outcome, o.cost_by_outcome),
            (self.cost_failed, o.cost_failed),
            (self.cost_sources, o.cost_sources),
        ):
            mine.update(theirs)
        for name, (count, success, failure) in o.tools.items():
            sums = self.tools.setdefault(name, [0, 0, 0])
            sums[0] += count
            sums[1] += success
            sums[2] += failure
        self.turns_with += o.turns_with
        self.turns_without += o.turns_without
        self.sessions_with_any += o.sessions_with_any
        self.api_calls += o.api_calls
        self.prompt_tokens += o.prompt_tokens
        self.completion_tokens += o.completion_tokens
        self.duration_total += o.duration_total
        self.duration_max = max(self.duration_max, o.duration_max)
        self.sessions_with_labels += o.sessions_with_labels
        self.verification.merge(o.verification)

    def to_dict(self) -> dict[str, Any]:
        # Only runs with checks get the key, so statistics of runs without any stay as they were.
        verification = {"verification": self.verification.to_dict()} if self.verification.any else {}
        return {
            **verification,
            "counts": {
                "total": self.total,
                "kept": self.kept,
                "rejected": dict(sorted(self.rejected.items())),
                "failed": dict(sorted(self.failed.items())),
            },
            "exit_statuses": dict(sorted(self.exit_statuses.items())),
            "tools": {
                name: {"count": c, "success": s, "failure": f, "success_rate": _ratio(s, c)}
                for name, (c, s, f) in sorted(self.tools.items())
            },
            "tool_errors": dict(sorted(self.tool_errors.items())),
            "reasoning": {
                "turns_with": self.turns_with,
                "turns_without": self.turns_without,
                "sessions_with_any": self.sessions_with_any,
                "coverage": _ratio(self.turns_with, self.turns_with + self.turns_without),
            },
            "api_calls": {"total": self.api_calls, "mean_per_session": _ratio(self.api_calls, self.total)},
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
            },
            "cost": self._cost(),
            "duration_s": {
                "total": self.duration_total,
                "mean": _ratio(self.duration_total, self.total),
                "max": self.duration_max,
            },
            "safety": {
                "labels": dict(sorted(self.safety_labels.items())),
                "sessions_with_labels": self.sessions_with_labels,
            },
        }

    def _cost(self) -> dict[str, Any]:
        kept, rejected, failed = (self.cost_by_outcome[o] for o in (KEPT, REJECTED, FAILED))
        final = kept + rejected + failed
        return {
            "final_usd": final,
            "kept_usd": kept,
            "rejected_usd": rejected,
            "failed_usd": failed,
            "waste_usd": rejected + failed,
            "per_kept_usd": _ratio(final, self.kept),
            "failed_by_kind_usd": dict(sorted(self.cost_failed.items())),
            "by_source": dict(sorted(self.cost_sources.items())),
            "unpriced_sessions": self.cost_sources["unknown"],
        }


class StatsAccumulator:
    """Sums session summaries; partial accumulators (per worker, per batch) combine with ``merge``."""

    def __init__(self) -> None:
        self.overall = _Bucket()
        self.per_category: dict[str, _Bucket] = {}

    def add(self, summary: SessionSummary, outcome: str, reason: str | None = None) -> None:
        """Count one session with its ``classify`` result."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        if outcome == FAILED and reason is None:
            reason = failure_kind(summary.exit_status)
        self.overall.add(summary, outcome, reason)
        category = NO_CATEGORY if summary.category is None else summary.category
        bucket = self.per_category.get(category)
        if bucket is None:  # not setdefault: that builds a bucket (nine counters) per record to drop it
            bucket = self.per_category[category] = _Bucket()
        bucket.add(summary, outcome, reason)

    def merge(self, other: StatsAccumulator) -> None:
        """Add ``other``'s counts to this accumulator."""
        self.overall.merge(other.overall)
        for category, bucket in other.per_category.items():
            self.per_category.setdefault(category, _Bucket()).merge(bucket)

    def to_dict(self) -> dict[str, Any]:
        """The statistics document (see the module docstring for every key)."""
        body = self.overall.to_dict()
        body["per_category"] = {name: b.to_dict() for name, b in sorted(self.per_category.items())}
        return body
