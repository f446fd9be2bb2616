"""CLI side of verified trajectories: ``raygen rescore`` (registered by raygen.cli) and the reward table
that ``raygen run`` and ``raygen merge`` print under their summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from raygen.errors import ConfigError, InputError
from raygen.output.verify_stats import reward_buckets

err = Console(stderr=True, soft_wrap=True)


def verification_rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """Rows for the run's summary table (none for a run without checks)."""
    v = stats.get("verification")
    if not v:
        return []
    rows: list[tuple[str, Any]] = [
        ("mean reward", _num(v.get("mean_reward"))),
        ("pass rate", _pct(v.get("pass_rate"))),
        ("verify errors", f"{v.get('verify_errors', 0)} ({_pct(v.get('error_share'))} of checked)"),
    ]
    pass_at = v.get("pass_at_k") or {}
    if pass_at:
        rows.append(("pass@k", "  ".join(f"@{k} {_pct(x)}" for k, x in pass_at.items())))
    return rows


def verification_table(stats: dict[str, Any]) -> Table | None:
    """Per category and overall: graded, mean reward, pass rate, pass@1..K, verify errors."""
    if not stats.get("verification"):
        return None
    buckets, ks = reward_buckets(stats)
    table = Table(title="rewards (all sessions, before filters)")
    for col in (
        "category",
        "graded",
        "mean reward",
        "pass rate",
        *(f"pass@{k}" for k in ks),
        "verify errors",
    ):
        table.add_column(col)
    for name, b in buckets:
        pass_at = b.get("pass_at_k") or {}
        table.add_row(
            name,
            str(b.get("graded", 0)),
            _num(b.get("mean_reward")),
            _pct(b.get("pass_rate")),
            *(_pct(pass_at.get(str(k))) for k in ks),
            str(b.get("verify_errors", 0)),
        )
    return table


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def rescore(
    run_dir: Annotated[str, typer.Argument(help="A run folder (a path, or s3://... / gs://...).")],
    dataset: Annotated[
        Path | None, typer.Option(help="The prompts file with the fixed checks [the run's dataset].")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Checks run at once.")] = 4,
) -> None:
    """Grade the stored artifacts of every verified session again with the dataset's current checks (no
    model call), then re-merge: after fixing a flaky test or a verifier bug."""
    from raygen.run.rescore import rescore as rescore_run

    try:
        result = rescore_run(run_dir, dataset=dataset, concurrency=concurrency)
    except (ConfigError, InputError, OSError) as exc:
        err.print(Text.assemble(("error", "bold red"), f": {exc}"), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    err.print(
        f"rescored {result.regraded} sessions: {result.changed} changed, {result.errors} checks could not run"
        f", {result.skipped} skipped (row gone or without a check)"
        + (f", {result.damaged} damaged records left as they were" if result.damaged else ""),
        highlight=False,
    )
    if result.merge is not None:
        table = verification_table(result.merge.stats)
        if table is not None:
            err.print(table)


def register(app: typer.Typer) -> None:
    """Add ``rescore`` to the ``raygen`` command."""
    app.command("rescore")(rescore)
