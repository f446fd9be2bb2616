"""``raygen report``: one self-contained HTML file describing a merged run.

Data: ``manifest.json`` and ``statistics.json`` (aggregates), plus ONE streaming pass over
``data/``, ``rejected/`` and ``failed/`` that feeds fixed-bin histograms (``RunProfile``) and a seeded
sample stratified by category x outcome (``StratifiedSampler``, positions only). The few sampled
records are then re-read by position and cut to a byte budget for the viewer. Memory and page size are
bounded by the sample size and the budget, not by the run: a run of 100,000 sessions gives a page of a
few MB.

The page loads nothing from anywhere: CSS, charts (inline SVG), data (JSON in a
``<script type="application/json">`` element, with ``<``, ``>`` and ``&`` escaped) and the viewer's
vanilla JavaScript are all inline.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from raygen.eval.cost import cost_section
from raygen.eval.html import esc, section, table
from raygen.eval.profile import RunProfile
from raygen.eval.rewards import rewards_section
from raygen.eval.runread import ScanCounts, iter_run_records, load_run
from raygen.eval.sections import (
    accounting_section,
    exit_section,
    failures_section,
    manifest_section,
    reasoning_section,
    sessions_section,
    tools_section,
)
from raygen.eval.strata import StratifiedSampler
from raygen.eval.tokens import template_check_section
from raygen.eval.viewer import embed_json, viewer_entry
from raygen.output.filters import OUTCOMES
from raygen.output.run_dir import REPORT_FILE, TEMPLATE_CHECK_FILE, RunDir
from raygen.output.shards import RecordReader

DEFAULT_SAMPLE = 500
"""Most trajectories embedded in the viewer."""
DEFAULT_VIEWER_BUDGET = 3_000_000
"""Bytes of viewer JSON shared by the embedded trajectories (each is cut to its share)."""
_MARKER = re.compile(r"@@(TITLE|BODY|DATA)@@")
_NAV = (
    ("manifest", "Manifest"),
    ("accounting", "Accounting"),
    ("tools", "Tools"),
    ("sessions", "Sessions"),
    ("exit", "Exit statuses"),
    ("reasoning", "Reasoning"),
    ("failures", "Rejections & failures"),
    ("rewards", "Rewards"),
    ("cost", "Cost"),
    ("tokens", "Tokens"),
    ("viewer", "Trajectories"),
)


@dataclass
class ReportResult:
    """What ``write_report`` wrote and what it cost."""

    path: Path | str
    """A local file, or the URI of the run's own ``report.html`` on an object store."""
    size_bytes: int
    records_scanned: int
    trajectories_embedded: int
    seconds: float


def _max_turns(manifest: dict[str, Any]) -> int:
    gen = manifest.get("generation") or {}
    session = (manifest.get("config") or {}).get("session") or {}
    return int(gen.get("max_turns") or session.get("max_turns") or 10)


def _consistency_notes(stats: dict[str, Any], counts: ScanCounts) -> list[str]:
    """Say so when the folders and statistics.json disagree (e.g. a merge was interrupted or files
    were edited): the plots from the two sources would not add up otherwise."""
    expected = stats.get("counts") or {}
    want = {
        "kept": int(expected.get("kept") or 0),
        "rejected": sum((expected.get("rejected") or {}).values()),
        "failed": sum((expected.get("failed") or {}).values()),
    }
    notes = [
        f"statistics.json counts {want[o]:,} {o} sessions but the {o} files hold {counts.records[o]:,}: "
        "re-run `raygen merge` to bring them in line"
        for o in OUTCOMES
        if want[o] != counts.records[o]
    ]
    if counts.unparseable_lines:
        notes.append(f"{counts.unparseable_lines:,} lines of the output files are not JSON objects (skipped)")
    return notes


def _viewer_section(entries: list[dict[str, Any]], sampler: StratifiedSampler, seed: int, limit: int) -> str:
    embedded: dict[tuple[str, str], int] = {}
    for entry in entries:
        stratum = (entry["category"], entry["outcome"])
        embedded[stratum] = embedded.get(stratum, 0) + 1
    population = sum(sampler.offered.values())
    rows = [
        (cat, outcome, f"{n:,}", f"{embedded.get((cat, outcome), 0):,}")
        for (cat, outcome), n in sorted(sampler.offered.items())
    ]
    selects = "".join(
        f'<select id="{sid}" aria-label="{label}"><option value="">{label}: all</option></select>'
        for sid, label in (
            ("rg-f-category", "category"),
            ("rg-f-outcome", "outcome"),
            ("rg-f-exit", "exit status"),
            ("rg-f-tool", "tool called"),
        )
    )
    return section(
        "viewer",
        "Trajectories",
        f"<details><summary>sample per category and outcome</summary>"
        f"{table(['category', 'outcome', 'sessions', 'embedded'], rows, numeric_from=2)}</details>",
        f'<div class="filters">{selects}'
        '<input type="search" id="rg-search" placeholder="search text, ids, tool calls, results…">'
        '<span id="rg-count" class="dim"></span></div>'
        '<div class="viewer"><ul id="rg-list"></ul>'
        '<div id="rg-detail"><p class="empty">Pick a trajectory on the left.</p></div></div>',
        intro=(
            f"{len(entries):,} of {population:,} sessions are embedded: a seeded sample (seed {seed}, "
            f"at most {limit:,}) shared fairly among category and outcome. Long texts are cut (marked "
            "in place); `raygen sample RUN_DIR --per-category N` writes full records for review."
        ),
    )


def _sample_entries(
    run_dir: RunDir, sampler: StratifiedSampler, limit: int, budget: int
) -> list[dict[str, Any]]:
    picks = [item for items in sampler.take(limit).values() for item in items]
    per_entry = budget // max(len(picks), 1)
    entries = []
    with RecordReader(run_dir=run_dir) as reader:
        for pos, outcome, reason in picks:
            entries.append(viewer_entry(reader.read(pos), outcome, reason, per_entry))
    entries.sort(key=lambda e: (e["category"], OUTCOMES.index(e["outcome"]), e["id"]))
    return entries


def build_report(
    run_dir: RunDir | str | Path,
    *,
    sample_size: int = DEFAULT_SAMPLE,
    seed: int = 0,
    viewer_budget: int = DEFAULT_VIEWER_BUDGET,
) -> tuple[str, int, int]:
    """The report page of ``run_dir``; returns ``(html, records_scanned, trajectories_embedded)``."""
    info = load_run(run_dir)
    profile = RunProfile(_max_turns(info.manifest))
    sampler = StratifiedSampler(sample_size, seed)
    counts = ScanCounts()
    for item in iter_run_records(info.run_dir, counts=counts):
        profile.add(item.record)
        sampler.offer((item.category, item.outcome), item.key, (item.pos, item.outcome, item.reason))
    entries = _sample_entries(info.run_dir, sampler, sample_size, viewer_budget)

    stats, profile_doc = info.statistics, profile.to_dict()
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    nav = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in _NAV)
    body = (
        f"<header><h1>raygen report · {esc(info.name)}</h1>"
        f'<div class="sub">{esc(_where(info.run_dir))} · generated {esc(generated)}</div></header>'
        f"<nav>{nav}</nav><main>"
        + manifest_section(info.manifest)
        + accounting_section(stats, _consistency_notes(stats, counts))
        + tools_section(stats, profile_doc)
        + sessions_section(profile_doc)
        + exit_section(stats)
        + reasoning_section(stats)
        + failures_section(stats)
        + rewards_section(stats)
        + cost_section(stats)
        + template_check_section(_template_check(info.run_dir))
        + _viewer_section(entries, sampler, seed, sample_size)
        + "</main>"
    )
    values = {
        "TITLE": esc(f"raygen report · {info.name}"),
        "BODY": body,
        "DATA": embed_json({"run": info.name, "trajectories": entries}),
    }
    template = resources.files("raygen.eval").joinpath("report_template.html").read_text(encoding="utf-8")
    # One pass: text inserted for one marker is never searched for another.
    html = _MARKER.sub(lambda m: values[m.group(1)], template)
    return html, sum(counts.records.values()), len(entries)


def _template_check(run_dir: RunDir) -> dict[str, Any] | None:
    """The last ``raygen export --check`` of the run, if any (an unreadable one is shown as none)."""
    if not run_dir.exists(TEMPLATE_CHECK_FILE):
        return None
    try:
        check = run_dir.read_json(TEMPLATE_CHECK_FILE)
    except (OSError, ValueError):
        return None
    return check if isinstance(check, dict) else None


def _where(run_dir: RunDir) -> str:
    return str(run_dir.local_path.resolve()) if run_dir.is_local else str(run_dir)


def write_report(
    run_dir: RunDir | str | Path,
    out: str | Path | None = None,
    *,
    sample_size: int = DEFAULT_SAMPLE,
    seed: int = 0,
    viewer_budget: int = DEFAULT_VIEWER_BUDGET,
) -> ReportResult:
    """Build the report and write it (default ``RUN_DIR/report.html``, on the run's storage) atomically."""
    started = time.perf_counter()
    run_dir = RunDir.of(run_dir)
    html, scanned, embedded = build_report(
        run_dir, sample_size=sample_size, seed=seed, viewer_budget=viewer_budget
    )
    data = html.encode("utf-8")
    if out is None and not run_dir.is_local:
        run_dir.write_bytes(REPORT_FILE, [data])
        return ReportResult(
            run_dir.describe(REPORT_FILE), len(data), scanned, embedded, time.perf_counter() - started
        )
    path = Path(out) if out is not None else run_dir.local_path / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return ReportResult(path, len(data), scanned, embedded, time.perf_counter() - started)
