"""The ``raygen report`` section of a verified run: reward histogram and pass@k per category."""

from __future__ import annotations

from typing import Any

from raygen.eval import svg
from raygen.eval.html import figure, num, pct, section, table
from raygen.output.verify_stats import HISTOGRAM_BINS, reward_buckets


def rewards_section(stats: dict[str, Any]) -> str:
    """Says so for a run without checks (the navigation always links here)."""
    overall = stats.get("verification")
    if not overall:
        return section(
            "rewards", "Rewards", intro="No session of this run had a check (no row carried verify)."
        )
    buckets, ks = reward_buckets(stats, overall="all")
    labels = [f"{i / HISTOGRAM_BINS:.1f}-{(i + 1) / HISTOGRAM_BINS:.1f}" for i in range(HISTOGRAM_BINS)]
    chart = svg.histogram(labels, overall.get("reward_histogram") or [0] * HISTOGRAM_BINS, label="rewards")
    rows = [
        [
            name,
            num(b.get("graded")),
            num(b.get("mean_reward"), 3),
            pct(b.get("pass_rate")),
            *(pct((b.get("pass_at_k") or {}).get(str(k))) for k in ks),
            num(b.get("verify_errors")),
            pct(b.get("error_share")),
        ]
        for name, b in buckets
    ]
    headers = [
        "category",
        "graded",
        "mean reward",
        "pass rate",
        *(f"pass@{k}" for k in ks),
        "verify errors",
        "share",
    ]
    return section(
        "rewards",
        "Rewards",
        figure("Reward of every graded session (all samples, before filters)", chart),
        table(headers, rows),
        intro="pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) averaged over prompt groups with at "
        "least k graded samples; a check that could not run (verify_error) counts as an error, never as a 0.",
    )
