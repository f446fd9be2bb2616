"""The report's sections as HTML: manifest, accounting, tools, sessions, exit statuses, reasoning,
rejections and failures. Aggregates come from ``statistics.json``; shapes from a ``RunProfile``."""

from __future__ import annotations

import json
from typing import Any

from raygen.eval import svg
from raygen.eval.html import (
    details,
    esc,
    figure,
    kv_table,
    num,
    pct,
    pre_json,
    rate_cell,
    ratio,
    section,
    table,
)
from raygen.eval.profile import METRICS
from raygen.output.filters import REJECTION_REASONS

SMALL_MULTIPLES = 12
"""Categories drawn as small multiples (the largest ones); every category is in the tables."""


def _categories(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return stats.get("per_category") or {}


def _total(bucket: dict[str, Any]) -> int:
    return int((bucket.get("counts") or {}).get("total") or 0)


def _outcome_counts(bucket: dict[str, Any]) -> dict[str, int]:
    counts = bucket.get("counts") or {}
    return {
        "kept": int(counts.get("kept") or 0),
        "rejected": sum((counts.get("rejected") or {}).values()),
        "failed": sum((counts.get("failed") or {}).values()),
    }


def manifest_section(manifest: dict[str, Any]) -> str:
    """What produced the run: dataset version, model, endpoint and provider route, limits, versions."""
    gen = manifest.get("generation") or {}
    config = manifest.get("config") or {}
    system_prompt = gen.get("system_prompt")
    return section(
        "manifest",
        "Run manifest",
        kv_table(_generation_rows(manifest) + _run_rows(manifest)),
        details("system prompt", pre_json(system_prompt)) if system_prompt else "",
        details("tool schemas", pre_json(gen.get("tool_schemas") or [])),
        details("resolved config (manifest.json)", pre_json(config)),
    )


def _generation_rows(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    """The manifest's rows on what decides a session's output: dataset, model, endpoint, sampling, tools."""
    gen = manifest.get("generation") or {}
    config = manifest.get("config") or {}
    dataset = manifest.get("dataset") or {}
    sampling = gen.get("sampling") or config.get("sampling") or {}
    route = sampling.get("extra_body") or {}
    distribution = gen.get("distribution") or {}
    tools = [((s or {}).get("function") or {}).get("name", "?") for s in gen.get("tool_schemas") or []]
    system_prompt = gen.get("system_prompt")
    return [
        ("run", manifest.get("run_name")),
        ("dataset", f"{dataset.get('path', '?')} ({dataset.get('rows', '?')} rows)"),
        ("dataset sha256", dataset.get("sha256")),
        ("model", f"{gen.get('model') or manifest.get('model')} ({gen.get('model_type', '?')})"),
        ("endpoint", gen.get("base_url") or manifest.get("base_url") or "—"),
        ("provider route (extra_body)", json.dumps(route, ensure_ascii=False) if route else "none"),
        (
            "sampling",
            ", ".join(f"{k}={v}" for k, v in sampling.items() if k != "extra_body" and v is not None)
            or "provider defaults",
        ),
        ("max turns", gen.get("max_turns")),
        ("system prompt", "none" if not system_prompt else f"{len(system_prompt):,} characters"),
        (
            "toolset distribution",
            f"{distribution.get('name', '?')}: "
            + ", ".join(f"{k} {v:g}%" for k, v in (distribution.get("toolsets") or {}).items()),
        ),
        ("tools", ", ".join(tools) or "none"),
    ]


def _run_rows(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    """The manifest's rows on how the run ran: environment, rate limits, filters, seed, times, versions."""
    gen = manifest.get("generation") or {}
    config = manifest.get("config") or {}
    env = config.get("env") or {}
    governor = {
        k: v for k, v in (config.get("governor") or {}).items() if k in ("rpm", "tpm", "max_in_flight")
    }
    return [
        (
            "environment",
            ", ".join(f"{k}={v}" for k, v in env.items() if k in ("type", "bwrap", "default_image")),
        ),
        ("rate limits", ", ".join(f"{k}={v}" for k, v in governor.items() if v is not None) or "none"),
        ("filters", ", ".join(f"{k}={v}" for k, v in (config.get("filters") or {}).items())),
        ("run seed", gen.get("seed", config.get("seed"))),
        ("config fingerprint", manifest.get("config_fingerprint")),
        (
            "started / ended",
            f"{manifest.get('started_at') or '?'} / {manifest.get('ended_at') or 'not finished'}",
        ),
        (
            "versions",
            f"raygen {manifest.get('raygen_version')}, python {manifest.get('python_version')}, "
            f"ray {manifest.get('ray_version')}, openai {manifest.get('openai_version')}",
        ),
        ("host", manifest.get("host")),
    ]


def accounting_section(stats: dict[str, Any], notes: list[str]) -> str:
    """Totals, outcomes overall and per category, and the merge's own counters."""
    counts = stats.get("counts") or {}
    total = int(counts.get("total") or 0)
    outcome = _outcome_counts(stats)
    cards = "".join(
        f'<div class="card {cls}"><div class="big">{num(value)}</div><div>{label}</div></div>'
        for label, value, cls in (
            ("sessions", total, ""),
            (f"kept ({pct(ratio(outcome['kept'], total))})", outcome["kept"], "kept"),
            (f"rejected ({pct(ratio(outcome['rejected'], total))})", outcome["rejected"], "rejected"),
            (f"failed ({pct(ratio(outcome['failed'], total))})", outcome["failed"], "failed"),
            ("tokens", (stats.get("tokens") or {}).get("total", 0), ""),
            ("model calls", (stats.get("api_calls") or {}).get("total", 0), ""),
        )
    )
    reasons = [("rejected: " + k, v) for k, v in (counts.get("rejected") or {}).items()]
    reasons += [("failed: " + k, v) for k, v in (counts.get("failed") or {}).items()]
    rows = []
    for name, bucket in _categories(stats).items():
        c, n = _outcome_counts(bucket), _total(bucket)
        rows.append(
            (
                name,
                num(n),
                num(c["kept"]),
                num(c["rejected"]),
                num(c["failed"]),
                pct(ratio(c["kept"], n)),
                pct(ratio(c["failed"], n)),
            )
        )
    chart = svg.stacked_bars(
        [(name, _outcome_counts(b)) for name, b in _categories(stats).items()],
        ["kept", "rejected", "failed"],
        label="outcome per category",
    )
    merge = stats.get("merge") or {}
    notes_html = "".join(f'<p class="warn">{esc(note)}</p>' for note in notes)
    return section(
        "accounting",
        "Accounting",
        notes_html,
        f'<div class="cards">{cards}</div>',
        figure("Outcome per category (share of sessions; hover for counts)", chart),
        table(["category", "sessions", "kept", "rejected", "failed", "kept %", "failure %"], rows),
        table(["outcome: reason", "sessions"], reasons) if reasons else "",
        details("merge counters (statistics.json: merge)", pre_json(merge)) if merge else "",
    )


def tools_section(stats: dict[str, Any], profile: dict[str, Any]) -> str:
    """Calls and success rates per tool, overall and per category; tool error kinds."""
    tools = stats.get("tools") or {}
    cats = _categories(stats)
    calls = svg.bar_chart(
        [(name, t.get("count", 0)) for name, t in tools.items()], label="tool calls per tool"
    )
    rates = svg.bar_chart(
        [(name, t.get("success_rate") or 0.0) for name, t in tools.items() if t.get("count")],
        fmt=lambda v: f"{v:.1%}",
        max_value=1.0,
        color=svg.OUTCOME_COLORS["kept"],
        label="success rate per tool",
    )
    per_cat_rows = []
    for tool in tools:
        cells: list[Any] = [tool]
        for bucket in cats.values():
            t = (bucket.get("tools") or {}).get(tool) or {}
            cells.append(rate_cell(int(t.get("count") or 0), t.get("success_rate")))
        per_cat_rows.append(cells)
    using = profile.get("sessions_using_tool") or {}
    share_rows = []
    for tool in tools:
        share_rows.append(
            [tool]
            + [
                pct(ratio((using.get(cat) or {}).get(tool, 0), _total(bucket)))
                for cat, bucket in cats.items()
            ]
        )
    error_kinds = sorted({k for b in [stats, *cats.values()] for k in (b.get("tool_errors") or {})})
    error_rows = [
        [name, *[num((bucket.get("tool_errors") or {}).get(k, 0)) for k in error_kinds]]
        for name, bucket in [("all", stats), *cats.items()]
    ]
    return section(
        "tools",
        "Tools",
        '<div class="row">',
        figure("Tool calls (all sessions)", calls),
        figure("Success rate per tool", rates),
        "</div>",
        "<h3>Per category: calls · success rate</h3>",
        table(["tool", *cats], per_cat_rows),
        "<h3>Per category: share of sessions calling the tool</h3>",
        table(["tool", *cats], share_rows),
        "<h3>Tool errors by kind</h3>",
        table(["category", *error_kinds], error_rows)
        if error_kinds
        else '<p class="empty">no tool errors</p>',
    )


def _trim(hist: dict[str, Any], bins: int) -> tuple[list[str], list[int]]:
    return hist["labels"][:bins], hist["counts"][:bins]


def _used_bins(hist: dict[str, Any]) -> int:
    """Bins up to the last non-empty one of the run (at least 2): the same cut for every category of a
    metric, so small multiples stay aligned, without a long empty tail."""
    counts = hist.get("counts") or []
    last = max((i for i, c in enumerate(counts) if c), default=0)
    return min(max(last + 1, 2), len(counts))


def sessions_section(profile: dict[str, Any]) -> str:
    """Histograms of turns, tokens, duration and tool calls: overall, then per category."""
    overall = profile.get("overall") or {}
    per_cat = profile.get("per_category") or {}
    largest = sorted(per_cat, key=lambda c: (-(per_cat[c]["turns"]["n"]), c))[:SMALL_MULTIPLES]
    parts = []
    for i, (metric, title) in enumerate(METRICS.items()):
        color = svg.PALETTE[i % len(svg.PALETTE)]
        hist = overall.get(metric) or {"labels": [], "counts": []}
        bins = _used_bins(hist)
        multiples = "".join(
            figure(
                f"{cat} (n={per_cat[cat][metric]['n']:,}, mean {num(per_cat[cat][metric]['mean'], 1)})",
                svg.histogram(
                    *_trim(per_cat[cat][metric], bins),
                    width=220,
                    height=70,
                    color=color,
                    label=f"{title}, {cat}",
                ),
            )
            for cat in largest
        )
        parts.append(
            f"<h3>{esc(title)}</h3>"
            + '<div class="row">'
            + figure(
                f"all sessions (n={hist.get('n', 0):,}, mean {num(hist.get('mean'), 1)}, "
                f"max {num(hist.get('max'), 1)})",
                svg.histogram(*_trim(hist, bins), width=420, height=120, color=color, label=title),
            )
            + f'<div class="multiples">{multiples}</div></div>'
        )
    rows = [
        [cat, num(h["turns"]["n"]), *[num(h[m]["mean"], 1) for m in METRICS]] for cat, h in per_cat.items()
    ]
    more = len(per_cat) - len(largest)
    return section(
        "sessions",
        "Sessions",
        *parts,
        f'<p class="intro">{more} smaller categories are only in the table.</p>' if more > 0 else "",
        "<h3>Means per category</h3>",
        table(["category", "sessions", *METRICS.values()], rows),
        intro=(
            "Fixed bins, the same for every run (empty bins past the largest value are not drawn); the "
            "last bin of the full range is open. Hover a bar for its count and share."
        ),
    )


def exit_section(stats: dict[str, Any]) -> str:
    """Exit statuses overall and per category."""
    statuses = list((stats.get("exit_statuses") or {}).keys())
    cats = _categories(stats)
    rows = [(name, b.get("exit_statuses") or {}) for name, b in cats.items()]
    chart = svg.stacked_bars(
        [("all", stats.get("exit_statuses") or {}), *rows], statuses, label="exit statuses"
    )
    table_rows = [
        [name, *[num(s.get(k, 0)) for k in statuses]]
        for name, s in [("all", stats.get("exit_statuses") or {}), *rows]
    ]
    return section(
        "exit",
        "Exit statuses",
        figure("Exit status per category (share; hover for counts)", chart),
        table(["category", *statuses], table_rows),
    )


def reasoning_section(stats: dict[str, Any]) -> str:
    """Reasoning coverage (assistant turns with reasoning) and sessions with any reasoning, per category."""
    cats = _categories(stats)
    items = [("all", (stats.get("reasoning") or {}).get("coverage") or 0.0)]
    items += [(name, (b.get("reasoning") or {}).get("coverage") or 0.0) for name, b in cats.items()]
    rows = []
    for name, b in [("all", stats), *cats.items()]:
        r = b.get("reasoning") or {}
        rows.append(
            [
                name,
                num(r.get("turns_with", 0)),
                num(r.get("turns_without", 0)),
                pct(r.get("coverage")),
                pct(ratio(r.get("sessions_with_any", 0), _total(b))),
            ]
        )
    chart = svg.bar_chart(
        items, fmt=lambda v: f"{v:.1%}", max_value=1.0, color=svg.PALETTE[4], label="reasoning coverage"
    )
    return section(
        "reasoning",
        "Reasoning",
        figure("Assistant turns carrying reasoning", chart),
        table(["category", "turns with", "turns without", "coverage", "sessions with any"], rows),
    )


def failures_section(stats: dict[str, Any]) -> str:
    """Rejection reasons and failure kinds per category, and failure rates."""
    cats = _categories(stats)
    counts = stats.get("counts") or {}
    reasons = [r for r in REJECTION_REASONS if r in (counts.get("rejected") or {})]
    reasons += sorted(set(counts.get("rejected") or {}) - set(reasons))
    kinds = sorted(counts.get("failed") or {})
    rejected = svg.stacked_bars(
        [(name, (b.get("counts") or {}).get("rejected") or {}) for name, b in cats.items()],
        reasons,
        label="rejection reasons",
    )
    failed = svg.stacked_bars(
        [(name, (b.get("counts") or {}).get("failed") or {}) for name, b in cats.items()],
        kinds,
        label="failure kinds",
    )
    rate_items = [("all", ratio(_outcome_counts(stats)["failed"], _total(stats)) or 0.0)]
    rate_items += [(n, ratio(_outcome_counts(b)["failed"], _total(b)) or 0.0) for n, b in cats.items()]
    rejection_items = [("all", ratio(_outcome_counts(stats)["rejected"], _total(stats)) or 0.0)]
    rejection_items += [(n, ratio(_outcome_counts(b)["rejected"], _total(b)) or 0.0) for n, b in cats.items()]
    return section(
        "failures",
        "Rejections and failures",
        '<div class="row">',
        figure(
            "Rejection rate",
            svg.bar_chart(
                rejection_items, fmt=lambda v: f"{v:.1%}", max_value=1.0, color=svg.OUTCOME_COLORS["rejected"]
            ),
        ),
        figure(
            "Failure rate",
            svg.bar_chart(
                rate_items, fmt=lambda v: f"{v:.1%}", max_value=1.0, color=svg.OUTCOME_COLORS["failed"]
            ),
        ),
        "</div>",
        figure("Rejection reasons per category (share of rejected sessions)", rejected),
        figure("Failure kinds per category (share of failed sessions)", failed),
    )
