"""How the ``raygen`` command renders what a run reports: ``ConsoleReporter`` (rich, on stderr) and the
rows of the summary table. Kept apart from ``cli.py`` so the benchmarks' child process can render a run
like the CLI without importing every command."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from raygen.cli.progress import RunProgress
from raygen.hygiene.scan import HygieneReport
from raygen.input.validate import DatasetReport
from raygen.run.reporter import RunReporter


class ConsoleReporter(RunReporter):
    """Renders a run's reports on ``console``: plain lines (user text is never read as rich markup),
    warnings in yellow, a live progress bar on a terminal."""

    def __init__(self, console: Console):
        self.console = console

    def dataset_checked(self, report: DatasetReport) -> None:
        for line in report.summary_lines():
            self.console.print(line, highlight=False, markup=False)
        for notice in report.notices:
            self.warning(str(notice))

    def hygiene_checked(self, report: HygieneReport, *, refused: bool) -> None:
        from raygen.cli.hygiene import print_hygiene

        if report.has_findings and not refused:
            print_hygiene(report, self.console)
        else:  # a refusal lists the findings in its error
            for line in report.summary_lines():
                self.note(line)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def warning(self, text: str) -> None:
        self.console.print("[yellow]warning[/]: ", end="", highlight=False)
        # str(): rich renders any other object as its repr (a Notice showed as ``Notice(path=...)``).
        self.console.print(str(text), highlight=False, markup=False, soft_wrap=True)

    def progress(self, total: int) -> RunProgress:
        return RunProgress(total, self.console)


def summary_rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """The rows of the summary table of a merge's ``statistics.json``."""
    from raygen.cli.verify import verification_rows

    counts = stats.get("counts", {})
    rows: list[tuple[str, Any]] = [("total", counts.get("total", 0)), ("kept", counts.get("kept", 0))]
    rows += [(f"rejected: {k}", v) for k, v in sorted(counts.get("rejected", {}).items())]
    rows += [(f"failed: {k}", v) for k, v in sorted(counts.get("failed", {}).items())]
    tokens = stats.get("tokens", {})
    rows.append(
        ("tokens (prompt / completion)", f"{tokens.get('prompt', 0)} / {tokens.get('completion', 0)}")
    )
    reasoning = stats.get("reasoning", {})
    if reasoning.get("coverage") is not None:
        rows.append(("reasoning coverage (turns)", f"{reasoning['coverage']:.1%}"))
    return rows + _cost_rows(stats.get("cost") or {}) + verification_rows(stats)


def _cost_rows(cost: dict[str, Any]) -> list[tuple[str, Any]]:
    """Spend (docs/cost.md), when anything was spent: in all, per kept trajectory, and on what was not kept
    (rejected, failed, and attempts a later one replaced)."""
    total = cost.get("total_usd") or cost.get("final_usd") or 0.0
    if total <= 0:
        return []
    per_kept = cost.get("per_kept_usd")
    waste = (cost.get("waste_usd") or 0.0) + (cost.get("superseded_usd") or 0.0)
    return [
        ("spent (USD, all attempts)", f"{total:.4f}"),
        ("spent per kept trajectory", "-" if per_kept is None else f"{per_kept:.6f}"),
        ("spent on rejected/failed/retried", f"{waste:.4f}"),
    ]


def print_counts(stats: dict[str, Any], title: str, console: Console) -> None:
    """The summary table of a merge (``statistics.json``)."""
    table = Table(title=title, show_header=False)
    for label, value in summary_rows(stats):
        table.add_row(label, str(value))
    console.print(table)


def print_run_summary(result: Any, console: Console) -> None:
    """What ``raygen run`` shows at the end: the counts, the tools, the rewards, where the data is."""
    from raygen.cli.verify import verification_table

    stats = result.merge.stats
    print_counts(stats, f"run {result.run_dir.name}", console)
    tools = stats.get("tools", {})
    if tools:
        table = Table(title="tools (all sessions)")
        for column in ("tool", "calls", "success", "failure", "success rate"):
            table.add_column(column)
        for name, tool in sorted(tools.items()):
            rate = tool.get("success_rate")
            table.add_row(
                name,
                str(tool["count"]),
                str(tool["success"]),
                str(tool["failure"]),
                "-" if rate is None else f"{rate:.1%}",
            )
        console.print(table)
    if (rewards := verification_table(stats)) is not None:
        console.print(rewards)
    data = result.run_dir.describe("data")
    # An object store needs its fsspec driver (s3fs, gcsfs) and the builder named (docs/resume.md).
    how = f'"{data}"' if result.run_dir.is_local else f'"parquet", data_files="{data}/*.parquet"'
    console.print(f"output: {data} (load with datasets.load_dataset({how}))", highlight=False)
