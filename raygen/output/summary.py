"""The per-session summary: the small part of a record that filters and statistics need.

It crosses Ray's object store once per session (workers -> driver for live statistics) and is what the
merge classifies, so ``summarize`` is the single place that derives it from a record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pydantic import BaseModel

from raygen.errors import is_failure_status
from raygen.formats.records import Trajectory

# Only these record fields are read; a Trajectory is never fully dumped (its messages may be large).
_FIELDS = (
    "sample_key",
    "id",
    "prompt_index",
    "category",
    "attempt",
    "exit_status",
    "completed",
    "api_calls",
    "tool_stats",
    "tool_error_counts",
    "hallucinated_tools",
    "reasoning",
    "usage",
    "cost_usd",
    "cost_source",
    "timing",
    "safety_labels",
    "group_id",
    "sample_index",
    "reward",
    "verification",
)


@dataclass(slots=True)
class SessionSummary:
    """Counts of one session attempt; picklable and a few hundred bytes."""

    sample_key: str
    id: str
    prompt_index: int
    category: str | None
    attempt: int
    exit_status: str
    completed: bool
    api_calls: int = 0
    tool_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    """``{tool: {count, success, failure}}``."""
    tool_error_counts: dict[str, int] = field(default_factory=dict)
    hallucinated_calls: int = 0
    reasoning_with: int = 0
    """Assistant turns that carried reasoning."""
    reasoning_without: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_source: str = ""
    duration_s: float = 0.0
    safety_labels: dict[str, int] = field(default_factory=dict)
    """``{label: n}`` tool calls matched by the unsafe-action rules (one per matching rule)."""
    group_id: str | None = None
    """The prompt group (``--samples-per-prompt``); None for a single sample per row."""
    sample_index: int = 0
    reward: float | None = None
    """The check's reward; None without a check or when it could not run."""
    passed: bool | None = None
    """Whether the check passed; None when the record has no (completed) check."""
    rescored: int = 0
    """``verification.rescored``: the regrade this record is (0: the session's own grading)."""

    @property
    def failed(self) -> bool:
        """The attempt ended with an infrastructure/provider failure (``error:<kind>``)."""
        return is_failure_status(self.exit_status)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (e.g. to ship as a string column); ``from_dict`` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionSummary:
        """Rebuild from ``to_dict`` output; unknown keys are ignored (newer writers, older readers)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _plain(value: Any) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _int(value: Any) -> int:
    return int(value or 0)


INVALID_RECORD_ERRORS = (ValueError, TypeError, AttributeError)
"""What ``summarize`` raises on a JSON object that is not a usable record: the merge and the ledger both
skip such a record, so they agree on what a run folder holds."""


def summarize(record: dict[str, Any] | Trajectory) -> SessionSummary:
    """Derive the summary of a record (a Trajectory or its JSON dict).

    Tolerant of missing optional fields (they count as zero/empty); raises ``ValueError`` when the
    identity fields (``sample_key``, ``prompt_index``) are missing or malformed.

    ``hallucinated_calls`` is the larger of ``len(hallucinated_tools)`` and
    ``tool_error_counts["hallucinated"]``: the two should agree, and a record filling only one of
    them must still be caught by the hallucination filter.
    """
    if isinstance(record, Trajectory):
        record = {name: getattr(record, name) for name in _FIELDS}
    if not isinstance(record, dict):
        raise ValueError(f"record is not an object: {type(record).__name__}")
    sample_key = record.get("sample_key")
    if not isinstance(sample_key, str) or not sample_key:
        raise ValueError("record has no sample_key")
    prompt_index = record.get("prompt_index")
    if not isinstance(prompt_index, int) or isinstance(prompt_index, bool):
        raise ValueError(f"record {sample_key} has no integer prompt_index")

    tool_stats: dict[str, dict[str, int]] = {}
    for name, stat in (record.get("tool_stats") or {}).items():
        stat = _plain(stat) or {}
        tool_stats[name] = {k: _int(stat.get(k)) for k in ("count", "success", "failure")}
    error_counts = {k: _int(v) for k, v in (record.get("tool_error_counts") or {}).items()}
    reasoning = _plain(record.get("reasoning")) or {}
    usage = _plain(record.get("usage")) or {}
    timing = _plain(record.get("timing")) or {}
    category = record.get("category")
    return SessionSummary(
        sample_key=sample_key,
        id=str(record.get("id") or sample_key),
        prompt_index=prompt_index,
        category=None if category is None else str(category),
        attempt=_int(record.get("attempt", 1)),
        exit_status=str(record.get("exit_status") or "completed"),
        completed=bool(record.get("completed", False)),
        api_calls=_int(record.get("api_calls")),
        tool_stats=tool_stats,
        tool_error_counts=error_counts,
        hallucinated_calls=max(
            len(record.get("hallucinated_tools") or ()), error_counts.get("hallucinated", 0)
        ),
        reasoning_with=_int(reasoning.get("with_reasoning")),
        reasoning_without=_int(reasoning.get("without_reasoning")),
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cost_usd=float(record.get("cost_usd") or 0.0),
        cost_source=str(record.get("cost_source") or ""),
        duration_s=float(timing.get("duration_s") or 0.0),
        safety_labels=_label_counts(record.get("safety_labels")),
        group_id=None if record.get("group_id") is None else str(record["group_id"]),
        sample_index=_int(record.get("sample_index")),
        reward=None if record.get("reward") is None else float(record["reward"]),
        passed=_passed(record.get("reward"), _plain(record.get("verification"))),
        rescored=_int((_plain(record.get("verification")) or {}).get("rescored")),
    )


def _label_counts(labels: Any) -> dict[str, int]:
    """``{label: n}`` of a record's ``safety_labels`` (SafetyLabel models or their dicts)."""
    counts: dict[str, int] = {}
    for item in labels or ():
        item = _plain(item)
        label = item.get("label") if isinstance(item, dict) else None
        if label:
            counts[str(label)] = counts.get(str(label), 0) + 1
    return counts


def _passed(reward: Any, verification: Any) -> bool | None:
    """A graded record's ``verification.passed``; None when the check never produced a reward."""
    if reward is None or not isinstance(verification, dict):
        return None
    return bool(verification.get("passed"))
