"""How the ``raygen`` command renders what a run reports: ``ConsoleReporter`` (rich, on stderr) and the
rows of the summary table. Kept apart from ``cli.py`` so the benchmarks' child process can render a run
like the CLI without importing every command."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from raygen.hygiene.scan import HygieneReport
from raygen.input.validate import DatasetReport
from raygen.progress import RunProgress
from raygen.reporting import RunReporter


class ConsoleReporter(RunReporter):
    """Renders a run's reports on ``console``: plain lines (user text is never read as rich markup),
    warnings in yellow, a live progress bar on a terminal."""

    def __init__(self, console: Console):
        self.console = console

    def dataset_checked(self, report: DatasetReport) -> None:
        for line in report.summary_lines():
            self.console.print(line, highlight=False, markup=False)
        for notice in report.notices:
            self.warning(notice)

    def hygiene_checked(self, report: HygieneReport, *, refused: bool) -> None:
        from raygen.hygiene.commands import print_hygiene

        if report.has_findings and not refused:
            print_hygiene(report, self.console)
        else:  # a refusal lists the findings in its error
            for line in report.summary_lines():
                self.note(line)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def warning(self, text: str) -> None:
        self.console.print("[yellow]warning[/]: ", end="", highlight=False)
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def progress(self, total: int) -> RunProgress:
        return RunProgress(total, self.console)


def summary_rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """The rows of the summary table of a merge's ``statistics.json``."""
    from raygen.verify.commands import verification_rows

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
    return rows + verification_rows(stats)
