"""What a run tells its user while it works, as calls on a ``RunReporter``: the library reports, the
front end renders. ``raygen run`` passes the CLI's ``ConsoleReporter`` (rich, on stderr); code that calls
``raygen.run.driver.run`` itself gets this base class, which writes every report to the ``raygen`` logger.

No module of the library prints: a new message is one more ``note``/``warning`` call, or a new method
here with a logging default when it carries data a front end may want to render (a report, a table).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raygen.hygiene.scan import HygieneReport
    from raygen.input.validate import DatasetReport

log = logging.getLogger("raygen")


class Progress:
    """The counts of one pass of ``total`` sessions, shown while they arrive. This one logs a line every
    ``every_s`` seconds and at the end; a front end's subclass overrides ``show``."""

    def __init__(self, total: int, *, every_s: float = 10.0):
        self.total = total
        self.done = 0
        self.failed = 0
        self.statuses: Counter[str] = Counter()
        self.extra = ""
        """More text for the line, e.g. kept/rejected counts and the governor's state."""
        self.started = time.monotonic()
        self.every_s = every_s
        self._last_shown = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.show(final=True)

    def update(self, exit_status: str) -> None:
        """One session came back with ``exit_status``."""
        self.done += 1
        self.statuses[exit_status] += 1
        if exit_status.startswith("error:"):
            self.failed += 1
        self.show()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        rate = self.rate()
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        extra = f" | {self.extra}" if self.extra else ""
        return (
            f"progress: {self.done}/{self.total} sessions, {rate:.1f}/s, eta {eta:.0f}s, "
            f"failed {self.failed}{extra}"
        )

    def due(self, final: bool) -> bool:
        """Whether a throttled display should show a line now (every ``every_s`` seconds, and at the end)."""
        now = time.monotonic()
        if not final and now - self._last_shown < self.every_s:
            return False
        self._last_shown = now
        return True

    def show(self, final: bool = False) -> None:
        if self.due(final):
            log.info(self.line())


class RunReporter:
    """Receives what a run reports. Every method has a logging default, so a front end overrides only
    what it renders differently."""

    def dataset_checked(self, report: DatasetReport) -> None:
        """The dataset was read and validated (before any model call); invalid datasets raise after this."""
        for line in report.summary_lines():
            log.info(line)
        for notice in report.notices:
            log.warning(notice)

    def hygiene_checked(self, report: HygieneReport, *, refused: bool) -> None:
        """The prompts were scanned for secrets, personal data and eval-set rows. ``refused``: the run
        stops (``hygiene.on_findings: refuse``) and the error lists the findings."""
        for line in report.summary_lines():
            log.info(line)
        if not refused:
            for item in [*report.findings, *report.overlaps]:
                log.warning(str(item))

    def note(self, text: str) -> None:
        """One line about what the run does (plan, simulator address, pass retries, drain, cleanup)."""
        log.info(text)

    def warning(self, text: str) -> None:
        """Something the user should look at; the run goes on."""
        log.warning(text)

    def progress(self, total: int) -> Progress:
        """The display of one pass of ``total`` sessions (a context manager)."""
        return Progress(total)
