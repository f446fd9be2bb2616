"""The Ray Data pipeline: pending samples -> session actors -> (record, summary) stream to the driver.

The driver writes the pending samples into chunk files under the run's ``work/`` folder and Ray reads
them itself (``read_text``), so the prompt set is streamed, never held whole in the driver. Results are
consumed as they come (``iter_batches``) and handed to ``on_result``, which writes shards and statistics.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import ray
import ray.data

from raygen.distributed.plan import WorkerPlan
from raygen.distributed.worker import SessionWorker
from raygen.input.rows import Sample
from raygen.output.summary import SessionSummary

log = logging.getLogger(__name__)

# Ray Data runs up to this many batches of one task at once for an async UDF (its default); a batch's
# rows run concurrently, so an actor with two tasks in flight can fill all its session slots.
_ASYNC_BATCHES_PER_TASK = 4
_TASKS_PER_ACTOR = 2


def write_pending(samples: Iterable[Sample], work_dir: Path, chunk_rows: int) -> tuple[list[Path], int]:
    """Write samples as JSONL chunk files; returns the files and the number of samples."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for old in work_dir.glob("pending-*.jsonl"):
        old.unlink()
    files: list[Path] = []
    count = 0
    fh = None
    for sample in samples:
        if count % chunk_rows == 0:
            if fh:
                fh.close()
            path = work_dir / f"pending-{len(files):05d}.jsonl"
            files.append(path)
            fh = path.open("w", encoding="utf-8")
        fh.write(sample.model_dump_json() + "\n")
        count += 1
    if fh:
        fh.close()
    return files, count


def batch_size_for(sessions_per_worker: int) -> int:
    return max(1, math.ceil(sessions_per_worker / _ASYNC_BATCHES_PER_TASK))


def run_pipeline(
    plan: WorkerPlan,
    files: list[Path],
    on_result: Callable[[str, SessionSummary], None],
) -> None:
    """Run every sample in ``files`` through the session actors, calling ``on_result(record_json,
    summary)`` in the driver for each finished session."""
    rc = plan.config.ray
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # raygen prints its own progress
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # Reading prompt chunks is trivial work; a whole CPU per read task would starve on small nodes
    # (Ray Data's budget splits the CPUs between operators, and the actors hold some).
    ds = ray.data.read_text([str(f) for f in files], num_cpus=0.05)
    ds = ds.map_batches(
        SessionWorker,
        fn_constructor_kwargs={"plan": plan},
        batch_size=batch_size_for(rc.sessions_per_worker),
        compute=ray.data.ActorPoolStrategy(
            size=rc.workers,
            max_tasks_in_flight_per_actor=2 * _TASKS_PER_ACTOR,
            max_concurrent_calls_per_actor=_TASKS_PER_ACTOR,
        ),
        num_cpus=rc.num_cpus_per_worker,
    )
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        records = batch.column("record").to_pylist()
        summaries = batch.column("summary").to_pylist()
        for record, summary in zip(records, summaries, strict=True):
            on_result(record, SessionSummary(**json.loads(summary)))
