"""Reward statistics of verified sessions: mean reward, pass rate, unbiased pass@k, verification errors.

pass@k is the unbiased estimator of Chen et al. (2021), averaged over prompt groups: for a group of ``n``
graded samples of which ``c`` passed, ``1 - C(n - c, k) / C(n, k)``, the chance that at least one of ``k``
samples drawn without replacement passes. A group counts for every ``k <= n``. A sample whose check could
not run (``verify_error``) is not graded: it counts as an error, never as a failed sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Any

VERIFY_ERROR = "error:verify_error"
HISTOGRAM_BINS = 10


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one group with ``n`` graded samples, ``c`` of them passed (``k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class VerificationStats:
    """Sums over the sessions of one bucket (the run or a category); mergeable."""

    graded: int = 0
    """Sessions whose check ran and gave a reward."""
    passed: int = 0
    reward_sum: float = 0.0
    errors: int = 0
    """Sessions whose check could not run (``verify_error``)."""
    groups: dict[str, list[int]] = field(default_factory=dict)
    """``{group_id: [graded n, passed c]}`` of prompt groups (``--samples-per-prompt`` K > 1)."""
    singles: list[int] = field(default_factory=lambda: [0, 0])
    """``[graded, passed]`` of samples without a group: each is a group of one, counted, not stored."""
    histogram: list[int] = field(default_factory=lambda: [0] * HISTOGRAM_BINS)
    """Graded sessions per reward bin: [0, 0.1), [0.1, 0.2), ... [0.9, 1.0]."""

    def add(self, exit_status: str, reward: float | None, passed: bool | None, group: str | None) -> None:
        if exit_status == VERIFY_ERROR:
            self.errors += 1
            return
        if reward is None:
            return
        self.graded += 1
        self.passed += bool(passed)
        self.reward_sum += reward
        self.histogram[min(int(reward * HISTOGRAM_BINS), HISTOGRAM_BINS - 1)] += 1
        counts = self.singles if group is None else self.groups.setdefault(group, [0, 0])
        counts[0] += 1
        counts[1] += bool(passed)

    def merge(self, other: VerificationStats) -> None:
        self.graded += other.graded
        self.passed += other.passed
        self.reward_sum += other.reward_sum
        self.errors += other.errors
        self.singles = [self.singles[0] + other.singles[0], self.singles[1] + other.singles[1]]
        self.histogram = [a + b for a, b in zip(self.histogram, other.histogram, strict=True)]
        for group, (n, c) in other.groups.items():
            counts = self.groups.setdefault(group, [0, 0])
            counts[0] += n
            counts[1] += c

    @property
    def any(self) -> bool:
        return bool(self.graded or self.errors)

    def pass_at(self) -> dict[str, float]:
        """``{"k": mean pass@k over the groups with at least k graded samples}`` for k = 1..largest n."""
        largest = max((n for n, _ in self.groups.values()), default=1 if self.singles[0] else 0)
        out = {}
        for k in range(1, largest + 1):
            values = [pass_at_k(n, c, k) for n, c in self.groups.values() if n >= k]
            total, count = sum(values), len(values)
            if k == 1:  # a single sample is a group of one: its pass@1 is 1 if it passed
                total, count = total + self.singles[1], count + self.singles[0]
            out[str(k)] = total / count
        return out

    def to_dict(self) -> dict[str, Any]:
        checked = self.graded + self.errors
        return {
            "graded": self.graded,
            "passed": self.passed,
            "pass_rate": self.passed / self.graded if self.graded else None,
            "mean_reward": self.reward_sum / self.graded if self.graded else None,
            "verify_errors": self.errors,
            "error_share": self.errors / checked if checked else None,
            "groups": len(self.groups) + self.singles[0],
            "pass_at_k": self.pass_at(),
            "reward_histogram": list(self.histogram),
        }


def verification_metrics(bucket: dict[str, Any]) -> dict[str, float | None]:
    """The comparable reward figures of one statistics bucket (``raygen compare``); none without checks."""
    v = bucket.get("verification")
    if not v:
        return {}
    out = {
        "mean_reward": v.get("mean_reward"),
        "pass_rate": v.get("pass_rate"),
        "verify_error_share": v.get("error_share"),
    }
    out.update({f"pass@{k}": x for k, x in (v.get("pass_at_k") or {}).items()})
    return out


def reward_buckets(stats: dict[str, Any], overall: str = "(all)") -> tuple[list[tuple[str, dict]], list[int]]:
    """The ``verification`` figures of every category that has them, then the run's (named ``overall``),
    and the k of every pass@k among them: what the CLI table and the report section show."""
    buckets = [
        (name, b["verification"])
        for name, b in (stats.get("per_category") or {}).items()
        if b.get("verification")
    ]
    if stats.get("verification"):
        buckets.append((overall, stats["verification"]))
    ks = sorted({int(k) for _, b in buckets for k in b.get("pass_at_k") or {}})
    return buckets, ks
