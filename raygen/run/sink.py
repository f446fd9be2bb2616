"""Where the driver puts each finished session: its record into a shard file, its outcome into the
ledger (what the next pass runs), this invocation's statistics, and the progress display.

Records are durable within ``output.durable_within_s`` of arriving: the buffer is written (and fsynced)
when its oldest record is half that old, by ``add`` or, when no record comes, by ``tick``; the other half
covers the trip from the session actor and the write itself."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raygen.config import RunConfig
from raygen.output.filters import classify
from raygen.output.shards import RollingShardWriter
from raygen.output.stats import StatsAccumulator
from raygen.output.summary import SessionSummary
from raygen.run.forecast import PerSession
from raygen.run.ledger import Ledger
from raygen.run.reporter import Progress, RunReporter


class ResultSink:
    def __init__(
        self,
        run_dir: Path,
        ledger: Ledger,
        config: RunConfig,
        reporter: RunReporter,
        status_line: Callable[[], str] = lambda: "",
        on_budget_reached: Callable[[], None] = lambda: None,
        spent_before_usd: float = 0.0,
    ):
        out = config.output
        flush_s = min(out.shard_flush_s, out.durable_within_s) / 2
        self.writer = RollingShardWriter(
            run_dir, f"driver-{uuid.uuid4().hex[:12]}", out.shard_max_records, flush_s
        )
        self.ledger = ledger
        self.filters = config.filters
        self.reporter = reporter
        self.status_line = status_line
        """Extra text for the progress line (the governor's state)."""
        self.attempts = StatsAccumulator()
        """Every attempt of this invocation, superseded ones included."""
        self.kept = self.rejected = 0
        self.sessions = 0
        """Sessions delivered in this invocation, over all passes."""
        self.on_budget_reached = on_budget_reached
        """Told when a session ended at the run's budget: the driver stops admitting (a drain)."""
        self.spent_before_usd = spent_before_usd
        self.spent_usd = 0.0
        """What this invocation's sessions cost."""
        self.cost_per_session, self.duration_per_session = PerSession(), PerSession()
        self._progress: Progress | None = None

    @contextmanager
    def progress(self, total: int) -> Iterator[Progress]:
        """The progress display of one pass of ``total`` sessions."""
        with self.reporter.progress(total) as progress:
            self._progress = progress
            try:
                yield progress
            finally:
                self._progress = None
                self.sessions += progress.done

    def add(self, record_json: str, summary: SessionSummary) -> None:
        self.writer.add(record_json)
        self.ledger.record(summary.sample_key, summary.attempt, summary.exit_status)
        outcome, reason = classify(summary, self.filters)
        self.kept += outcome == "kept"
        self.rejected += outcome == "rejected"
        self.attempts.add(summary, outcome, reason)
        self.spent_usd += summary.cost_usd
        self.cost_per_session.add(summary.cost_usd)
        self.duration_per_session.add(summary.duration_s)
        if summary.exit_status == "error:budget_reached":
            self.on_budget_reached()
        if self._progress is not None:
            extra = self.status_line()
            self._progress.extra = f"kept {self.kept} rejected {self.rejected}{self._spend()}" + (
                f" | {extra}" if extra else ""
            )
            self._progress.update(summary.exit_status)

    def _spend(self) -> str:
        """`` | $X spent, ~$Y at end``: the run's spend so far and, at this pass's rate per session, at
        its end."""
        if self.spent_usd <= 0 or self._progress is None:
            return ""
        done = self._progress.done + 1  # the session being added
        projected = self.spent_before_usd + self.spent_usd / done * max(done, self._progress.total)
        return f" | ${self.spent_before_usd + self.spent_usd:.4f} spent, ~${projected:.4f} at end"

    def tick(self) -> None:
        """Write the buffer if its oldest record is due, also when no new record arrives."""
        if self.writer.due:
            self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def live_statistics(self) -> dict[str, Any]:
        """What only the live run knows, for ``statistics.json``'s ``this_invocation``."""
        per_session = {
            "cost_usd": self.cost_per_session.to_dict(),
            "duration_s": self.duration_per_session.to_dict(),
        }
        return {"attempts": self.attempts.to_dict(), "per_session": per_session}
