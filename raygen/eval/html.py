"""Tiny HTML helpers for the report: escaping by default, ``Raw`` for fragments already built."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any


class Raw(str):
    """A fragment of HTML that must not be escaped again (charts, nested tags)."""


def esc(value: Any) -> str:
    """Escaped text of any value (``Raw`` passes through)."""
    if isinstance(value, Raw):
        return value
    return escape("" if value is None else str(value))


def pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}%}"


def num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric_from: int = 1, cls: str = ""
) -> str:
    """A table; columns from ``numeric_from`` on are right-aligned. Cells are escaped unless ``Raw``."""
    head = "".join(
        f"<th{' class=num' if i >= numeric_from else ''}>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f"<td{' class=num' if i >= numeric_from else ''}>{esc(cell)}</td>" for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        return '<p class="empty">nothing to show</p>'
    return (
        f'<div class="table-wrap"><table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column key/value table."""
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<div class="table-wrap"><table class="kv"><tbody>{body}</tbody></table></div>'


def pre_json(value: Any) -> Raw:
    return Raw(f"<pre>{esc(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>")


def details(summary: str, content: str, *, open_: bool = False) -> Raw:
    return Raw(f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>{content}</details>")


def section(anchor: str, title: str, *parts: str, intro: str = "") -> str:
    """A titled report section; ``intro`` is escaped text, ``parts`` are HTML."""
    intro_html = f'<p class="intro">{esc(intro)}</p>' if intro else ""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{intro_html}{"".join(parts)}</section>'


def figure(caption: str, chart: str) -> str:
    return f"<figure><figcaption>{esc(caption)}</figcaption>{chart}</figure>"


def rate_cell(count: int, rate: float | None) -> Raw:
    """``calls · rate`` with a background that goes from red (0 %) to green (100 %)."""
    if not count:
        return Raw('<span class="dim">—</span>')
    hue = 0 if rate is None else round(120 * rate)
    return Raw(
        f'<span class="rate" style="background:hsl({hue} 65% 88%)">{count:,} · {esc(pct(rate, 0))}</span>'
    )
