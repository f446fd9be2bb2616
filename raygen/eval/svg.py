"""Small inline SVG charts: horizontal bars, 100 % stacked bars and histograms.

Hand-written on purpose (see README.md): the report's charts are bars over counts it already has, the
output must be one offline HTML file, and a few KB of SVG per chart with a hover ``<title>`` on every
bar beats a plotting dependency that would emit images ten times larger. Every text is escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

# Okabe-Ito, readable by colour-blind viewers; cycled for series without a fixed colour.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
OUTCOME_COLORS = {"kept": "#009E73", "rejected": "#E69F00", "failed": "#D55E00"}
# Failure statuses (``error:<kind>``) get warm/dark colours so they never look like an outcome that is fine.
FAILURE_PALETTE = ("#D55E00", "#8C2D04", "#CC79A7", "#B2182B", "#7A0177", "#F4A582")
_CHAR_W = 6.6  # px per character at the 11px chart font, for layout only
_FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def color_for(name: str, index: int) -> str:
    """A stable colour: outcomes and statuses keep theirs, other series cycle the palette."""
    if name in OUTCOME_COLORS:
        return OUTCOME_COLORS[name]
    if name == "completed":
        return OUTCOME_COLORS["kept"]
    if name == "max_turns":
        return OUTCOME_COLORS["rejected"]
    if name.startswith("error:"):
        return FAILURE_PALETTE[index % len(FAILURE_PALETTE)]
    return PALETTE[index % len(PALETTE)]


def _short_label(label: str, max_chars: int) -> str:
    return label if len(label) <= max_chars else label[: max_chars - 1] + "…"


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}" {_FONT}>'
        + "".join(body)
        + "</svg>"
    )


def empty(message: str = "no data") -> str:
    return f'<p class="empty">{escape(message)}</p>'


def bar_chart(
    items: Sequence[tuple[str, float]],
    *,
    fmt: Callable[[float], str] = lambda v: f"{v:,.0f}",
    max_value: float | None = None,
    width: int = 520,
    color: str = PALETTE[0],
    label: str = "bar chart",
) -> str:
    """One horizontal bar per ``(label, value)``; ``max_value`` fixes the scale (e.g. 1.0 for rates)."""
    if not items:
        return empty()
    label_chars = min(max(len(name) for name, _ in items), 28)
    left, right, bar_h, gap = label_chars * _CHAR_W + 8, 70, 16, 5
    top = max_value if max_value is not None else max((v for _, v in items), default=0) or 1
    scale = (width - left - right) / top
    body = []
    for i, (name, value) in enumerate(items):
        y = i * (bar_h + gap)
        w = max(value, 0) * scale
        body.append(
            f"<g><title>{escape(name)}: {escape(fmt(value))}</title>"
            f'<text x="{left - 6:.0f}" y="{y + 12}" text-anchor="end">{escape(_short_label(name, 28))}</text>'
            f'<rect x="{left:.0f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color}" rx="2"/>'
            f'<text x="{left + w + 4:.1f}" y="{y + 12}">{escape(fmt(value))}</text></g>'
        )
    return _svg(width, len(items) * (bar_h + gap), body, label)


def stacked_bars(
    rows: Sequence[tuple[str, dict[str, float]]],
    series: Sequence[str],
    *,
    width: int = 620,
    label: str = "stacked bars",
) -> str:
    """One 100 % bar per row, split into ``series`` (in that order), with a legend; each segment's
    tooltip gives the count and the share."""
    rows = [(name, values) for name, values in rows if sum(values.values()) > 0]
    if not rows or not series:
        return empty()
    label_chars = min(max(len(name) for name, _ in rows), 28)
    left, right, bar_h, gap, legend_h = label_chars * _CHAR_W + 8, 60, 16, 5, 22
    span = width - left - right
    body, x = [], left
    for i, name in enumerate(series):  # legend
        body.append(
            f'<rect x="{x:.0f}" y="3" width="10" height="10" fill="{color_for(name, i)}"/>'
            f'<text x="{x + 14:.0f}" y="12">{escape(name)}</text>'
        )
        x += 14 + len(name) * _CHAR_W + 14
    width = max(width, int(x))
    for r, (name, values) in enumerate(rows):
        y = legend_h + r * (bar_h + gap)
        total = sum(values.values())
        body.append(
            f'<text x="{left - 6:.0f}" y="{y + 12}" text-anchor="end"><title>{escape(name)}</title>'
            f"{escape(_short_label(name, 28))}</text>"
        )
        x = left
        for i, part in enumerate(series):
            value = values.get(part, 0)
            if value <= 0:
                continue
            w = value / total * span
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color_for(part, i)}">'
                f"<title>{escape(name)} · {escape(part)}: {value:,.0f} ({value / total:.1%})</title></rect>"
            )
            x += w
        body.append(f'<text x="{left + span + 4:.0f}" y="{y + 12}">{total:,.0f}</text>')
    return _svg(width, legend_h + len(rows) * (bar_h + gap), body, label)


def histogram(
    labels: Sequence[str],
    counts: Sequence[int],
    *,
    width: int = 300,
    height: int = 110,
    color: str = PALETTE[0],
    label: str = "histogram",
) -> str:
    """Vertical bars over fixed bins, labels under them (slanted); tooltips give count and share."""
    total = sum(counts)
    if not total:
        return empty()
    bottom, left, top_pad = 46, 26, 12  # left: room for the first slanted label
    step = (width - left) / len(counts)
    scale = (height - top_pad) / max(counts)
    body = []
    for i, (name, count) in enumerate(zip(labels, counts, strict=True)):
        x = left + i * step
        h = count * scale
        body.append(
            f"<g><title>{escape(name)}: {count:,} ({count / total:.1%})</title>"
            f'<rect x="{x + 1:.1f}" y="{height - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="{color}"/>'
            f'<rect x="{x:.1f}" y="0" width="{step:.1f}" height="{height}" fill="transparent"/></g>'
            f'<text x="{x + step / 2:.1f}" y="{height + 10}" font-size="9" text-anchor="end" '
            f'transform="rotate(-40 {x + step / 2:.1f} {height + 10})">{escape(name)}</text>'
        )
    body.append(f'<line x1="{left}" x2="{width}" y1="{height}" y2="{height}" stroke="#888"/>')
    return _svg(width, height + bottom, body, label)
