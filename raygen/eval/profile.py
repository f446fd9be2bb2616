"""Per-session distributions of a run (turns, tokens, duration, tool calls), overall and per category.

``statistics.json`` holds sums and means; a report also wants shapes. Histograms have FIXED bins (the
same for every run and category), so two runs' or two categories' plots line up and the pass needs
constant memory whatever the number of records.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from raygen.output.stats import NO_CATEGORY

TOKEN_EDGES = (0, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
COMPLETION_EDGES = (0, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
DURATION_EDGES = (0, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1_800, 3_600)
TOOL_CALL_EDGES = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)


def turn_edges(max_turns: int) -> tuple[int, ...]:
    """One bin per turn up to ``max_turns`` (the last bin is the sessions that hit the limit); above
    30 turns, 1-2-5 steps so the plot stays readable."""
    max_turns = max(int(max_turns), 1)
    if max_turns <= 30:
        return tuple(range(max_turns + 1))
    edges = {0, 1, 2, 3, 4, 5, max_turns}
    magnitude = 10
    while magnitude < max_turns:
        edges.update(m * magnitude for m in (1, 2, 5) if m * magnitude < max_turns)
        magnitude *= 10
    return tuple(sorted(edges))


def _short(value: float, unit: str) -> str:
    if unit == "s":
        for suffix, size in (("h", 3600), ("m", 60)):
            if value >= size and value % size == 0:
                return f"{value / size:g}{suffix}"
        return f"{value:g}s"
    for suffix, size in (("M", 1_000_000), ("k", 1_000)):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


@dataclass
class Histogram:
    """Counts over fixed bins ``[edges[i], edges[i+1])``; the last bin is open (``edges[-1]+``)."""

    edges: tuple[float, ...]
    unit: str = ""
    """``"n"``: whole counts; ``"s"``: durations; ``""``: large numbers (``1k``, ``1M``)."""
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    observed: int = 0
    """How many values were added."""
    max: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.edges)

    def add(self, value: float) -> None:
        index = bisect.bisect_right(self.edges, value) - 1
        self.counts[index if index > 0 else 0] += 1
        self.total += value
        self.observed += 1
        if value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s counts (same edges)."""
        if other.edges != self.edges:
            raise ValueError("histograms with different bins cannot be merged")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.observed += other.observed
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float | None:
        return self.total / self.observed if self.observed else None

    def labels(self) -> list[str]:
        """Bin labels: ``"3"`` and ``"6-7"`` (inclusive) for counts (``unit="n"``), ``"1k-2k"`` for
        tokens, ``"30s-1m"`` for durations; the last bin is ``"50+"``."""
        labels = []
        for i, low in enumerate(self.edges):
            if i == len(self.edges) - 1:
                labels.append(f"{_short(low, self.unit)}+")
            elif self.unit == "n":
                last = self.edges[i + 1] - 1
                labels.append(f"{low:g}" if last == low else f"{low:g}-{last:g}")
            else:
                labels.append(f"{_short(low, self.unit)}-{_short(self.edges[i + 1], self.unit)}")
        return labels

    def quantile(self, q: float) -> str | None:
        """The label of the bin holding the ``q`` quantile (a histogram cannot say more)."""
        if not self.observed:
            return None
        target, seen = q * self.observed, 0
        for label, count in zip(self.labels(), self.counts, strict=True):
            seen += count
            if seen >= target and count:
                return label
        return self.labels()[-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": self.labels(),
            "counts": list(self.counts),
            "n": self.observed,
            "mean": self.mean,
            "max": self.max,
        }


METRICS = {
    "turns": "model calls per session",
    "tokens": "tokens per session (prompt + completion)",
    "completion_tokens": "completion tokens per session",
    "duration_s": "session wall time (s)",
    "tool_calls": "tool calls per session",
}


def session_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The per-session numbers the histograms count, read tolerantly from a record."""
    usage = record.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    tool_calls = sum(int((s or {}).get("count") or 0) for s in (record.get("tool_stats") or {}).values())
    return {
        "turns": int(record.get("api_calls") or 0),
        "tokens": prompt + completion,
        "completion_tokens": completion,
        "duration_s": float((record.get("timing") or {}).get("duration_s") or 0.0),
        "tool_calls": tool_calls,
    }


_UNITS = {"turns": "n", "tool_calls": "n", "duration_s": "s"}


class RunProfile:
    """Histograms of ``METRICS`` for the whole run and per category, fed one record at a time."""

    def __init__(self, max_turns: int = 10):
        self._edges = {
            "turns": turn_edges(max_turns),
            "tokens": TOKEN_EDGES,
            "completion_tokens": COMPLETION_EDGES,
            "duration_s": DURATION_EDGES,
            "tool_calls": TOOL_CALL_EDGES,
        }
        self.per_category: dict[str, dict[str, Histogram]] = {}
        self.sessions_using_tool: dict[str, dict[str, int]] = {}
        """``{category: {tool: sessions that called it at least once}}``."""

    def _new(self) -> dict[str, Histogram]:
        return {name: Histogram(edges, unit=_UNITS.get(name, "")) for name, edges in self._edges.items()}

    def add(self, record: dict[str, Any]) -> None:
        category = record.get("category")
        category = NO_CATEGORY if category is None else str(category)
        bucket = self.per_category.get(category)
        if bucket is None:
            bucket = self.per_category[category] = self._new()
        for name, value in session_metrics(record).items():
            bucket[name].add(value)
        used = self.sessions_using_tool.setdefault(category, {})
        for tool, stat in (record.get("tool_stats") or {}).items():
            if int((stat or {}).get("count") or 0) > 0:
                used[tool] = used.get(tool, 0) + 1

    @property
    def overall(self) -> dict[str, Histogram]:
        """The whole run: the categories' histograms summed (cheaper than counting twice per record)."""
        total = self._new()
        for hists in self.per_category.values():
            for name, hist in hists.items():
                total[name].merge(hist)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": {name: h.to_dict() for name, h in self.overall.items()},
            "per_category": {
                cat: {name: h.to_dict() for name, h in hists.items()}
                for cat, hists in sorted(self.per_category.items())
            },
            "sessions_using_tool": self.sessions_using_tool,
        }
