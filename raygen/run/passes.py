"""The driver's execute phase: the pending samples run on Ray in passes, one per attempt level, into one
``ResultSink`` (raygen.run.driver)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raygen.input.pending import KEYS_SUFFIX
from raygen.input.rows import Sample
from raygen.output.run_dir import RunDir
from raygen.output.summary import summarize
from raygen.run.budget import BUDGET_DRAIN
from raygen.run.drain import Drain
from raygen.run.ledger import Ledger, worker_lost_record
from raygen.run.services import RunServices
from raygen.run.sink import ResultSink

_LOST = "no result came back: the worker running it died and Ray's task retries were exhausted"


def run_passes(
    services: RunServices,
    samples: Iterator[Sample],
    pending: int,
    run_dir: RunDir,
    ledger: Ledger,
    drain: Drain,
) -> tuple[int, dict[str, Any]]:
    """Run ``samples`` (the ``pending`` ones, as their next attempt) in passes until nothing is
    pending or ``drain`` is requested. Returns the number of sessions run and what only the live run knows
    (statistics of every attempt, the governor's history)."""
    from raygen.distributed.pipeline import chunk_rows_for, write_pending

    config = services.config
    work = run_dir.work_dir()  # on the driver's local disk, whatever storage holds the run
    sink = ResultSink(
        run_dir,
        ledger,
        config,
        services.reporter,
        services.monitor.line,
        on_budget_reached=lambda: drain.request(BUDGET_DRAIN),
        spent_before_usd=ledger.spent_usd,
    )
    try:
        for pass_no in range(1, config.retry.max_attempts + 1):
            if drain.requested:
                break
            # One chunk is one Ray task (a task re-run after its actor died skips the sessions that had
            # finished: control.py). Pass 1's size is known, so its chunks shrink towards its end
            # (pipeline.chunk_rows_for); a retry pass's is not (and small).
            files, count = write_pending(
                samples,
                work,
                (lambda written: chunk_rows_for(pending - written, config.ray))
                if pass_no == 1
                else config.ray.sessions_per_worker,
                alone=ledger.lost_worker_before,
                name=f"pass{pass_no}",
            )
            if not count:
                break
            if pass_no > 1:
                services.reporter.note(
                    f"pass {pass_no}: retrying {count} samples after infrastructure failures"
                )
                time.sleep(config.retry.pass_delay_s * 2 ** (pass_no - 2))  # backoff: 1x, 2x, 4x ...
            _run_pass(services, sink, files, count, drain)
            # The next pass is planned from this one's files: only their samples can still be pending.
            samples = ledger.still_pending(files, config.retry.max_attempts)
    finally:
        sink.close()
        for leftover in [*work.glob("*.jsonl"), *work.glob(f"*{KEYS_SUFFIX}")]:
            leftover.unlink()
    return sink.sessions, _live_statistics(sink, services)


def _live_statistics(sink: ResultSink, services: RunServices) -> dict[str, Any]:
    """Statistics of every attempt of this invocation, the governor's history and the budget spent."""
    live = sink.live_statistics()
    if (governor := services.monitor.report()) is not None:
        live["governor"] = governor
    if (budget := services.budget_report()) is not None:
        live["budget"] = budget
    return live


def _run_pass(services: RunServices, sink: ResultSink, files: list[Path], count: int, drain: Drain) -> None:
    """One pass over the samples in ``files``: each finished session into the sink, then each sample
    that never came back recorded as a retryable ``error:worker_lost`` (unless a drain stopped the pass:
    those samples simply stay pending)."""
    from raygen.distributed.pipeline import run_pipeline

    with sink.progress(count):
        run_pipeline(services.plan, files, sink.add, tick=sink.tick, drain=drain, rows=count)
        lost_samples = () if drain.requested else sink.ledger.undelivered(files)
        for lost in lost_samples:  # Ray gave up on their worker
            generation = services.generation
            record = worker_lost_record(
                lost, model=generation.model_name, config_fingerprint=generation.fingerprint, detail=_LOST
            )
            sink.add(record.model_dump_json(), summarize(record))
    sink.flush()
