"""CLI commands ``raygen report``, ``raygen sample`` and ``raygen compare`` (registered by raygen.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from raygen.errors import ConfigError

Opt = typer.Option
out = Console(soft_wrap=True)  # a wrapped line splits paths and breaks grep on logs
err = Console(stderr=True, soft_wrap=True)


def fail(exc: Exception) -> None:
    """One line on stderr and exit 2 (the run-folder commands' way to refuse)."""
    # Text, not markup: messages quote user data (paths, JSON) that may hold [brackets].
    err.print(Text.assemble(("error", "bold red"), f": {exc}"), highlight=False, soft_wrap=True)
    raise typer.Exit(2)


# Run folders are str, not Path: they may be object-store URIs (Path would fold s3://b into s3:/b).
def report(
    run_dir: Annotated[str, typer.Argument(help="A merged run folder (a path, or s3://... / gs://...).")],
    output: Annotated[Path | None, Opt("--out", "-o", help="HTML file [RUN_DIR/report.html].")] = None,
    sample: Annotated[int, Opt("--sample", min=0, help="Most trajectories in the viewer.")] = 500,
    seed: Annotated[int, Opt(help="Seed of the viewer's sample.")] = 0,
    budget_mb: Annotated[
        float, Opt("--viewer-budget-mb", min=0.1, help="Size budget of the embedded trajectories (MB).")
    ] = 3.0,
) -> None:
    """Write a self-contained HTML report of a run: manifest, accounting, plots, trajectory viewer."""
    from raygen.eval.report import write_report

    try:
        result = write_report(
            run_dir, output, sample_size=sample, seed=seed, viewer_budget=int(budget_mb * 1_000_000)
        )
    except (ConfigError, OSError) as exc:
        fail(exc)
    err.print(
        f"wrote {result.path} ({result.size_bytes / 1e6:.1f} MB; {result.records_scanned:,} records scanned, "
        f"{result.trajectories_embedded:,} trajectories embedded, {result.seconds:.1f} s)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def sample(
    run_dir: Annotated[str, typer.Argument(help="A merged run folder (a path, or s3://... / gs://...).")],
    per_category: Annotated[
        int, Opt("--per-category", min=1, help="Sessions per category (and per included outcome).")
    ],
    seed: Annotated[int, Opt(help="Seed of the pick.")] = 0,
    include: Annotated[
        str | None, Opt(help="Also sample these outcomes: rejected, failed (comma-separated).")
    ] = None,
    output: Annotated[Path | None, Opt("--out", "-o", help="Output folder [RUN_DIR/sample].")] = None,
) -> None:
    """Write a seeded, stratified review sample: sample.jsonl (full records) and sample.md (readable)."""
    from raygen.eval.sample import parse_include, write_sample

    try:
        result = write_sample(
            run_dir, output, per_category=per_category, seed=seed, include=parse_include(include)
        )
    except (ConfigError, OSError, ValueError) as exc:
        fail(exc)
    table = Table("category", "outcome", "sampled", "in run", title=f"review sample (seed {seed})")
    for (category, outcome), population in sorted(result.population.items()):
        table.add_row(category, outcome, str(result.picked.get((category, outcome), 0)), f"{population:,}")
    out.print(table)
    out.print(f"wrote {result.jsonl} and {result.markdown} ({result.total} sessions)", highlight=False)


def _is_rate(metric: str) -> bool:
    return metric.endswith(("rate", "coverage", "share"))


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return "—"
    if _is_rate(metric):
        return f"{value:.1%}"
    if metric.endswith("_usd"):
        return f"${value:,.4f}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def _delta(metric: str, value: float | None) -> str:
    if value is None:
        return ""
    if _is_rate(metric):
        return f"{value * 100:+.1f} pp"
    if metric.endswith("_usd"):
        return f"{value:+,.4f}"
    return f"{value:+,.1f}" if isinstance(value, float) else f"{value:+,}"


def _pair_table(title: str, rows: dict[str, dict[str, Any]], names: tuple[str, str], first: str) -> Table:
    table = Table(first, *names, "Δ (B - A)", title=title)
    for metric, pair in rows.items():
        table.add_row(metric, _fmt(metric, pair["a"]), _fmt(metric, pair["b"]), _delta(metric, pair["delta"]))
    return table


_CATEGORY_COLUMNS = (
    ("sessions", "sessions"),
    ("kept_rate", "kept"),
    ("failure_rate", "failed"),
    ("model_calls_per_session", "turns/session"),
    ("tokens_per_session", "tokens/session"),
    ("tool_success_rate", "tool success"),
    ("reasoning_coverage", "reasoning"),
)


def print_comparison(doc: dict[str, Any], console: Console) -> None:
    """The comparison document as rich tables (A -> B)."""
    from raygen.eval.compare import brief

    a, b = doc["runs"]["a"], doc["runs"]["b"]
    names = (f"A: {a['name']}", f"B: {b['name']}")
    console.print(f"A = {a['name']} ({a['dir']})\nB = {b['name']} ({b['dir']})", highlight=False)
    for diff in doc["differences"]:
        line = f": {diff['field']}: {brief(diff['a'], 70)} vs {brief(diff['b'], 70)}"
        console.print(Text.assemble(("differs (compared anyway)", "yellow"), line), highlight=False)
    for diff in doc["other_differences"]:
        line = f"also differs: {diff['field']}: {brief(diff['a'], 70)} vs {brief(diff['b'], 70)}"
        console.print(Text(line, style="dim"), highlight=False)
    console.print(_pair_table("overview", doc["overview"], names, "metric"))
    statuses = Table("exit status", *names, "Δ share", title="exit statuses (sessions, share)")
    for status, pair in doc["exit_statuses"].items():
        statuses.add_row(
            status,
            f"{pair['a']:,} ({_fmt('share', pair['a_share'])})",
            f"{pair['b']:,} ({_fmt('share', pair['b_share'])})",
            _delta(
                "share",
                None
                if pair["a_share"] is None or pair["b_share"] is None
                else pair["b_share"] - pair["a_share"],
            ),
        )
    console.print(statuses)
    tools = Table("tool", "calls A → B", "calls/session A → B", "success A → B", "Δ success", title="tools")
    for tool, t in doc["tools"].items():
        tools.add_row(
            tool,
            f"{_fmt('calls', t['calls']['a'])} → {_fmt('calls', t['calls']['b'])}",
            f"{_fmt('x', t['calls_per_session']['a'])} → {_fmt('x', t['calls_per_session']['b'])}",
            f"{_fmt('rate', t['success_rate']['a'])} → {_fmt('rate', t['success_rate']['b'])}",
            _delta("rate", t["success_rate"]["delta"]),
        )
    console.print(tools)
    if doc["tool_errors"]:
        console.print(_pair_table("tool errors", doc["tool_errors"], names, "kind"))
    cats = Table("category", *(label + " A → B" for _, label in _CATEGORY_COLUMNS), title="per category")
    for category, metrics in doc["categories"].items():
        cats.add_row(
            category,
            *(f"{_fmt(m, metrics[m]['a'])} → {_fmt(m, metrics[m]['b'])}" for m, _ in _CATEGORY_COLUMNS),
        )
    console.print(cats)


def compare(
    run_a: Annotated[str, typer.Argument(help="Run folder A.")],
    run_b: Annotated[str, typer.Argument(help="Run folder B.")],
    force: Annotated[bool, Opt(help="Compare even if model, tools, limits or route differ.")] = False,
    as_json: Annotated[bool, Opt("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Print two runs' statistics side by side (per tool, per category, exit statuses, tokens)."""
    from raygen.eval.compare import compare_runs

    try:
        doc = compare_runs(run_a, run_b, force=force)
    except (ConfigError, OSError) as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, ensure_ascii=False, default=str))
    else:
        print_comparison(doc, out)


def register(app: typer.Typer) -> None:
    """Add ``report``, ``sample`` and ``compare`` to the ``raygen`` command."""
    app.command("report")(report)
    app.command("sample")(sample)
    app.command("compare")(compare)
