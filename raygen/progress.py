"""Run progress: a live bar on a terminal, a plain line every few seconds otherwise (logs, CI, Slurm)."""

from __future__ import annotations

import time
from collections import Counter

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RunProgress:
    def __init__(self, total: int, console: Console, *, plain_every_s: float = 10.0, label: str = "sessions"):
        self.total = total
        self.console = console
        self.done = 0
        self.failed = 0
        self.statuses: Counter[str] = Counter()
        self.started = time.monotonic()
        self.plain_every_s = plain_every_s
        self._last_plain = 0.0
        self.extra: str = ""
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
            self._plain(force=True)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def update(self, exit_status: str) -> None:
        self.done += 1
        self.statuses[exit_status] += 1
        if exit_status.startswith("error:"):
            self.failed += 1
        info = f"failed {self.failed}" + (f" | {self.extra}" if self.extra else "")
        if self._bar:
            self._bar.update(self._task, completed=self.done, rate=f"{self.rate():.1f}/s", info=info)
        else:
            self._plain()

    def _plain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_plain < self.plain_every_s:
            return
        self._last_plain = now
        rate = self.rate()
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        extra = f" | {self.extra}" if self.extra else ""
        self.console.print(
            f"progress: {self.done}/{self.total} sessions, {rate:.1f}/s, eta {eta:.0f}s, "
            f"failed {self.failed}{extra}",
            highlight=False,
        )
