"""The terminal's progress display of a pass (the CLI's, through ``ConsoleReporter``): a live bar on a
terminal, a plain line every few seconds otherwise (logs, CI, Slurm)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from raygen.run.reporter import Progress as PassProgress


class RunProgress(PassProgress):
    def __init__(self, total: int, console: Console, *, plain_every_s: float = 10.0, label: str = "sessions"):
        super().__init__(total, every_s=plain_every_s)
        self.console = console
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task(label, total=total, rate="", info="")

    def __enter__(self) -> RunProgress:
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar:
            self._bar.stop()
        else:
            self.show(final=True)

    def show(self, final: bool = False) -> None:
        if self._bar:
            info = f"failed {self.failed}" + (f" | {self.extra}" if self.extra else "")
            self._bar.update(self._task, completed=self.done, rate=f"{self.rate():.1f}/s", info=info)
        elif self.due(final):
            self.console.print(self.line(), highlight=False)
