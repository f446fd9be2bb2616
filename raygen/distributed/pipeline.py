"""The Ray Data pipeline: pending samples -> session actors -> each finished session to the driver.

The driver writes the pending samples into chunk files under the run's ``work/`` folder and Ray reads
them itself (``read_text``), so the prompt set is streamed, never held whole in the driver. Ray Data
schedules the samples onto the session actors; each finished session's record comes back through the
run's control actor (``control.py``: not Ray Data's output, which waits for whole tasks) and is handed
to ``on_result`` as it arrives, which writes shards and statistics.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import ray
import ray.data
from ray.actor import ActorHandle

from raygen.config import RayConfig
from raygen.distributed.cluster import session_actor_resources
from raygen.distributed.control import start_control
from raygen.distributed.plan import WorkerPlan
from raygen.distributed.worker import SessionWorker
from raygen.errors import ClusterLost
from raygen.input.pending import PendingChunk, remove_chunks
from raygen.input.rows import Sample
from raygen.output.summary import SessionSummary

log = logging.getLogger(__name__)


class Drain(Protocol):
    """What the pipeline reads of the run's drain switch (``raygen.run.drain.Drain``, installed by the driver
    above this layer): whether a drain was asked for, and whether its time ran out."""

    @property
    def requested(self) -> bool: ...

    @property
    def expired(self) -> bool: ...


# Ray Data runs up to this many batches of one task at once for an async UDF (its default); a batch's
# rows run concurrently, so an actor with two tasks in flight can fill all its session slots.
_ASYNC_BATCHES_PER_TASK = 4
# A task whose actor dies is re-run on the restarted actor this many times; then Ray Data gives up on
# the block, the run goes on, and the driver records its samples as ``error:worker_lost`` (retryable up
# to retry.max_attempts). Ray Data's default (retry forever) would loop on a sample that kills its actor.
_TASK_RETRIES = 2
# Longest wait for a finished record in one call to the control actor: bounds how late a time-based
# flush and a drain's checks run.
_TAKE_WAIT_S = 0.2
# After a drain, how long the driver waits for Ray Data to run through the samples that are skipped.
_DRAIN_ITERATION_S = 10.0
# max_task_retries has no named map_batches parameter yet (Ray 2.60), only the deprecated **ray_remote_args.
warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated", module=__name__)


def write_pending(
    samples: Iterable[Sample],
    work_dir: Path,
    chunk_rows: int | Callable[[int], int],
    alone: Callable[[Sample], bool] | None = None,
    name: str = "pending",
) -> tuple[list[Path], int]:
    """Write samples as JSONL chunk files ``<name>-<n>.jsonl`` (each with its keys file,
    ``raygen.input.pending``), replacing earlier ones of that name; returns the files and the number of
    samples. ``chunk_rows`` is a chunk's size, or gives the next chunk's size from the number of samples
    written so far.

    A chunk is one Ray task, and a task whose worker keeps dying is given up as a whole, so samples for
    which ``alone(sample)`` is true (their worker was lost before) get a chunk of their own.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    remove_chunks(work_dir, name)
    size_after = chunk_rows if callable(chunk_rows) else (lambda _written: chunk_rows)
    files: list[Path] = []
    count = in_chunk = size = 0
    chunk: PendingChunk | None = None
    try:
        for sample in samples:
            count += 1
            if alone is not None and alone(sample):
                with PendingChunk(work_dir / f"{name}-{len(files):05d}.jsonl") as single:
                    single.write(sample)
                files.append(single.path)
                continue
            if in_chunk == size:
                if chunk:
                    chunk.close()
                chunk = PendingChunk(work_dir / f"{name}-{len(files):05d}.jsonl")
                files.append(chunk.path)
                in_chunk, size = 0, max(1, size_after(count - 1))
            assert chunk is not None  # opened above: in_chunk == size == 0 on the first sample
            chunk.write(sample)
            in_chunk += 1
    finally:
        if chunk:
            chunk.close()
    return files, count


def chunk_rows_for(remaining: int, ray_config: RayConfig) -> int:
    """Samples in the next chunk file, so the next Ray task, when ``remaining`` samples of the pass are
    still to be written (0: not known).

    Each task costs the driver, the worker reading the chunk and the actor tens of milliseconds of CPU
    (measured: a 3,000-session run with 32-sample chunks spent ~1.5 ms of CPU per session on tasks;
    with 128-sample chunks ~0.5 ms), so chunks hold up to 4 actors' slots worth. They shrink as the pass
    nears its end (a quarter of what is left per actor, down to one actor's slots), so the last tasks
    are short and no actor still works through rounds of sessions while the others sit idle (guided
    self-scheduling)."""
    per_worker = ray_config.sessions_per_worker
    if remaining <= 0:
        return per_worker
    return max(per_worker, min(4 * per_worker, math.ceil(remaining / (4 * ray_config.workers))))


def tasks_per_actor_for(rows: int, ray_config: RayConfig) -> int:
    """Ray tasks an actor holds at once, for a pass of ``rows`` samples.

    Three when the pass runs in several rounds of every actor's slots: when a task ends the next one
    takes a moment to arrive (Ray Data reads its chunk first), and with two the actor's slots were
    half empty meanwhile (64 x 200 ms benchmark: occupancy dipped to 32 of 64 every few seconds; 0.83x
    -> 0.92x of the asyncio runner's rate). Two when it fits in about one round: Ray Data hands tasks
    to actors as they come up, so the first actor up would take three of the blocks and leave the
    late ones too little (2 x 5,000 slots, 4 blocks: 7,500 sessions on one actor)."""
    return 3 if rows > 4 * ray_config.workers * ray_config.sessions_per_worker else 2


def batch_size_for(sessions_per_worker: int) -> int:
    return max(1, math.ceil(sessions_per_worker / _ASYNC_BATCHES_PER_TASK))


def run_pipeline(
    plan: WorkerPlan,
    files: list[Path],
    on_result: Callable[[str, SessionSummary], None],
    *,
    tick: Callable[[], None] = lambda: None,
    drain: Drain | None = None,
    rows: int = 0,
) -> None:
    """Run every sample in ``files`` through the session actors, calling ``on_result(record_json,
    summary)`` in the driver for each session as it finishes, and ``tick()`` at least every
    ``_TAKE_WAIT_S`` (for time-based flushes). ``rows`` (the samples in ``files``, 0 if not known) sets
    how many tasks an actor holds. Once ``drain`` is requested no new session starts; this
    returns when the sessions in flight have finished or the drain timed out."""
    control = start_control()
    consumer = _Consumer(_dataset(plan, files, control, tasks_per_actor_for(rows, plan.config.ray)))
    collect_records(_ControlCalls(control), consumer, on_result, tick, drain)


class _ControlCalls:
    """The driver's blocking calls to the run's control actor (``RunControl``). The actor lives on the
    driver's node: when it is gone, so is that node (or Ray), and the run cannot go on."""

    def __init__(self, actor: ActorHandle):
        self._actor = actor

    def take(self, wait_s: float) -> list[tuple[str, str]]:
        taken: list[tuple[str, str]] = self._get(self._actor.take.remote(wait_s))
        return taken

    def state(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._get(self._actor.state.remote()))  # Ray's stubs type it a list

    def drain(self) -> None:
        self._get(self._actor.drain.remote())

    @staticmethod
    def _get(ref: ray.ObjectRef) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # one line for the user, not Ray's traceback
            raise ClusterLost(
                f"the run's control actor is gone ({type(exc).__name__}): the driver's Ray node, or the"
                " cluster's head, left the cluster"
            ) from exc


def collect_records(
    control: _ControlCalls,
    consumer: _Consumer,
    on_result: Callable[[str, SessionSummary], None],
    tick: Callable[[], None],
    drain: Drain | None,
) -> None:
    """The driver's loop of a pass: hand each record to ``on_result`` as the control actor gets it,
    until Ray Data's iteration ended, or a drain's sessions in flight finished or ran out of time."""
    draining = False

    def take(wait_s: float) -> bool:
        taken = control.take(wait_s)
        for record, summary in taken:
            on_result(record, SessionSummary(**json.loads(summary)))
        tick()
        return bool(taken)

    while True:
        # Read before taking: every record handed over before Ray Data's iteration ended is in the queue.
        ended = consumer.done.is_set()
        if take(_TAKE_WAIT_S):
            continue
        if ended:
            log.info("pass ended: %s", control.state())
            consumer.raise_error()
            return
        if drain is not None and drain.requested:
            if not draining:
                control.drain()
                draining = True
                continue  # a session may have started between the last take and the switch
            state = control.state()
            if drain.expired or state["running"] == 0:
                log.info("drain ended (timed out: %s): %s", drain.expired, state)
                # Sessions that ended after the take above stopped counting as running with their
                # records already queued (``RunControl.exchange``): take those too.
                take(0)
                # The actors skip what is left without a session; give Ray Data a moment to end the
                # iteration, else it is abandoned (Ray stops under it, which it logs noisily).
                consumer.done.wait(_DRAIN_ITERATION_S)
                return


class _Consumer:
    """Iterates the dataset in a thread: its rows only say that batches ended (records take the
    control actor's path), and the iteration must go on while the driver writes records."""

    def __init__(self, ds: ray.data.Dataset):
        self.done = threading.Event()
        self._error: BaseException | None = None
        self._ds = ds
        threading.Thread(target=self._run, name="raygen-pass", daemon=True).start()

    def _run(self) -> None:
        try:
            for _ in self._ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                pass
        except BaseException as exc:  # handed to the driver's thread
            self._error = exc
        finally:
            self.done.set()

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error


def _dataset(
    plan: WorkerPlan, files: list[Path], control: ActorHandle, tasks_per_actor: int
) -> ray.data.Dataset:
    rc = plan.config.ray
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # raygen prints its own progress
    ctx.print_on_execution_start = False
    ctx.max_errored_blocks = -1  # a block lost past _TASK_RETRIES costs its samples, not the run
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # Its one warning says the progress bars are off, which is deliberate (the line above).
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    # Reading prompt chunks is trivial work and reserves no CPU: any reservation starves forever once the
    # actors hold the node's CPUs (8 workers x 0.25 on a 2-CPU node: no session ever started).
    # The chunk files exist only on the driver's node, so the reads run there: nodes need not share a
    # filesystem (what Ray Data's deprecated local:// scheme did).
    # At least two blocks per actor: a task is one block, so with fewer blocks than actors some actors
    # sit idle (2,000 samples in 2 chunk files reached 4 of 8 actors: 29% of the ideal rate).
    ds = ray.data.read_text(
        [str(f) for f in files],
        num_cpus=0,
        concurrency=1,  # else each 0-CPU read ran at once in its own ~200 MB worker process
        override_num_blocks=max(len(files), 2 * rc.workers),
        label_selector={"ray.io/node-id": ray.get_runtime_context().get_node_id()},
    )
    # Placement: the sandbox capacity each actor reserves (nodes without the backend get none).
    resources = session_actor_resources(rc, plan.config.env.type)
    ds = ds.map_batches(
        SessionWorker,
        fn_constructor_kwargs={"plan": plan, "control": control},
        batch_size=batch_size_for(rc.sessions_per_worker),
        compute=ray.data.ActorPoolStrategy(
            size=rc.workers,
            # Few tasks queued behind the running ones (tasks_per_actor_for): Ray Data hands tasks to
            # actors as they become ready, so with 4 the first actors up took 4 tasks each and the late
            # ones none (2,000 sessions on 8 actors ran as two waves of 1,000).
            max_tasks_in_flight_per_actor=tasks_per_actor,
            max_concurrent_calls_per_actor=tasks_per_actor,
        ),
        num_cpus=rc.num_cpus_per_worker,
        max_task_retries=_TASK_RETRIES,
        resources=resources or None,
    )
    return ds
