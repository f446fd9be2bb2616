"""The ``raygen report`` section on money (docs/cost.md): what the run spent, what of it went to kept
trajectories and what was waste (rejected, failed, superseded attempts), per category with a plot."""

from __future__ import annotations

from typing import Any

from raygen.eval import svg
from raygen.eval.html import figure, kv_table, num, section, table


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}"


def cost_section(stats: dict[str, Any]) -> str:
    """Says so for a run that recorded no spend (an unpriced model, or the free simulator)."""
    cost = stats.get("cost") or {}
    total = cost.get("total_usd", cost.get("final_usd")) or 0.0
    if total <= 0:
        return section(
            "cost", "Cost", intro="Nothing was spent, or the model had no price (set pricing; docs/cost.md)."
        )
    summary = kv_table(
        [
            ("spent (every attempt, resumes included)", _usd(total)),
            ("on kept trajectories", _usd(cost.get("kept_usd"))),
            ("per kept trajectory (final records)", _usd(cost.get("per_kept_usd"))),
            ("waste: rejected + failed", _usd(cost.get("waste_usd"))),
            ("waste: superseded attempts", _usd(cost.get("superseded_usd"))),
            ("sessions without a price", num(cost.get("unpriced_sessions"))),
        ]
    )
    per_category = stats.get("per_category") or {}
    rows, chart = [], []
    for name, bucket in sorted(per_category.items()):
        c = bucket.get("cost") or {}
        kept = (bucket.get("counts") or {}).get("kept", 0)
        rows.append(
            [name, num(kept), _usd(c.get("final_usd")), _usd(c.get("per_kept_usd")), _usd(c.get("waste_usd"))]
        )
        chart.append((name, float(c.get("final_usd") or 0.0)))
    by_kind = sorted((cost.get("failed_by_kind_usd") or {}).items())
    return section(
        "cost",
        "Cost",
        summary,
        figure(
            "Spend per category (final records)",
            svg.bar_chart(chart, fmt=lambda v: f"${v:,.4f}", label="spend"),
        ),
        table(["category", "kept", "spent", "per kept", "waste"], rows),
        table(["failure kind", "spent"], [[kind, _usd(usd)] for kind, usd in by_kind]) if by_kind else "",
        intro="USD from each record's cost_usd: the provider's reported cost, else tokens x the price.",
    )
