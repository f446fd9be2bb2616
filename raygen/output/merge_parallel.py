"""The merge's two passes spread over worker processes (issue 27): the same output, byte for byte in
``data/`` and the JSONL folders, as the one-process merge of ``merge.py``.

Why: one process merged ~2,500 records a second here (8 s of CPU for 20,000 records of 8 kB: parsing
each record twice, summarizing it, building its Parquet row), so the end of a large run waited minutes
for its merge. The work is per record, so it divides:

- pass 1: each worker reads a contiguous part of the shard list (``choose_finals`` over it, with every
  file's place in the whole list, so ranks compare across parts) and returns its best record per key;
  the driver keeps the best of those per key. A key's records in two parts count as superseded the same
  as in one process (every valid, expected record but the final one of its key).
- pass 2: the final records, in output order, are cut into the very row groups the one-process merge
  writes (256 records or 64 MB of JSON, from the positions' lengths). With at least one ``data/`` file
  per worker (``output.data_shard_records`` records each) each worker writes whole files and the
  driver only sums statistics; with fewer, each worker builds one group at a time (its Arrow
  table, JSONL bytes and statistics) and the driver writes the groups in order (compressing Parquet
  was then ~1 s of the driver's CPU per 20,000 records). At most ``2 x processes`` jobs are out at
  once, so memory stays bounded whatever the run's size.

Workers are forked from the driver (see ``_pool``): at the merge, or, in a run, before Ray starts
(``MergeWorkers.fork``), so that the merge can run while Ray is still up (its shutdown took 1.5 s on
one node) without forking a process that Ray's threads share. Object-store runs, the Hermes export (one
ordered writer) and small runs keep the one-process merge.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import logging
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from raygen.config import FilterConfig
from raygen.output.digests import DigestCache, gather_rows
from raygen.output.filters import FAILED, KEPT, REJECTED
from raygen.output.merge import (
    _ROW_GROUP_BYTES,
    _ROW_GROUP_RECORDS,
    FinalRecord,
    _chunks,
    choose_finals,
)
from raygen.output.run_dir import DATA_DIR, FAILED_DIR, REJECTED_DIR, RunDir
from raygen.output.schema import PARQUET_OPTIONS, SCHEMA, to_arrow_table
from raygen.output.shards import RecordReader, ShardScanStats
from raygen.output.stats import StatsAccumulator
from raygen.output.summary import summarize

logger = logging.getLogger(__name__)

MIN_RECORDS = 4000
"""Below this many shard records (estimated from bytes) one process is quicker than starting workers."""
MAX_PROCESSES = 8
_BYTES_PER_RECORD = 8000
"""A typical record's size, to judge from the shards' bytes whether a run is worth the workers."""

T = TypeVar("T")


def merge_processes(run: RunDir, hermes: object, requested: int | None, records: int | None = None) -> int:
    """How many processes the merge of ``run`` uses: ``requested``, or by the cores and the run's size
    (``records``, or estimated from its shards' bytes); 1 (the one-process merge) for object stores and
    the Hermes export."""
    if not run.is_local or hermes is not None:
        return 1
    if requested is not None:
        return max(1, requested)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if records is None:
        records = sum(entry.size for entry in run.list_shards()) // _BYTES_PER_RECORD
    return 1 if records < MIN_RECORDS else min(cores, MAX_PROCESSES)


@dataclass
class MergeWorkers:
    """Merge worker processes forked ahead of the merge; ``fork`` is the only way to get them."""

    pool: ProcessPoolExecutor
    processes: int

    @property
    def broken(self) -> bool:
        """Whether a worker died (the pool then refuses every job)."""
        return bool(getattr(self.pool, "_broken", False))  # the executor's own flag; no public API

    @classmethod
    @contextmanager
    def fork(cls, processes: int) -> Iterator[MergeWorkers]:
        """``processes`` workers forked now (a fork-context pool starts all of them at its first job),
        shut down when the block ends, however it ends."""
        pool = _pool(processes)
        try:
            list(pool.map(_ready, range(processes)))
            yield cls(pool, processes)
        finally:
            pool.shutdown(cancel_futures=True)


def _ready(_: int) -> int:
    return os.getpid()


@contextmanager
def workers_for(processes: int, given: MergeWorkers | None = None) -> Iterator[MergeWorkers | None]:
    """The workers of a merge in ``processes`` processes: ``given`` (left running: its owner stops
    them), or ``processes`` forked now and stopped after; None for a one-process merge, or when
    ``given`` are broken (one died, e.g. killed for memory): the merge then runs in this process rather
    than fork while a run's Ray threads are up."""
    if processes < 2:
        yield None
    elif given is not None:
        if given.broken:
            logger.warning("a merge worker died: merging in one process")
        yield None if given.broken else given
    else:
        with MergeWorkers.fork(processes) as workers:
            yield workers


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """No cyclic garbage collection in the driver while it merges: the merge makes an object or two per
    record and no cycles, and the collector, run again and again as they pile up, would walk the
    driver's whole heap each time (at a million samples its ledger and keys are most of a GiB)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _start_worker() -> None:
    # No cyclic garbage collection in the workers: a record's dicts hold no cycles, and the collector
    # walking tens of thousands of them cost ~15% of the merge's CPU.
    gc.disable()
    # Workers forked before a run die with the driver, even by SIGKILL: their siblings hold the pool's
    # queue open, so they would otherwise wait on it forever (PR_SET_PDEATHSIG, Linux only).
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _pool(processes: int) -> ProcessPoolExecutor:
    # Forked: a spawned or fork-server worker re-runs the caller's main script (``__mp_main__``), which a
    # notebook or a script without a main guard does not survive. The workers only read shard files and
    # build tables: they touch none of the driver's threads' state (forked before Ray starts or after
    # it stops).
    context = multiprocessing.get_context("fork")
    return ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=_start_worker)


def _ordered(
    pool: ProcessPoolExecutor, fn: Callable[..., T], jobs: Iterable[tuple], window: int
) -> Iterator[T]:
    """``fn(*job)`` for every job, results in job order, at most ``window`` jobs out at once."""
    out: deque[Future[T]] = deque()
    for job in jobs:
        out.append(pool.submit(fn, *job))
        if len(out) >= window:
            yield out.popleft().result()
    while out:
        yield out.popleft().result()


# ------------------------------------------------------------------------------------------ pass 1


def _finals_part(
    run_path: str, shards: list, file_order: dict[str, int], filters: FilterConfig, expected: set[str] | None
) -> tuple[dict[str, FinalRecord], dict[str, Any], ShardScanStats]:
    scan = ShardScanStats()
    run = RunDir.of(run_path)
    finals, counts = choose_finals(run, filters, expected, scan, shards, file_order, build_digests=True)
    return finals, counts, scan


def parallel_finals(
    run: RunDir,
    filters: FilterConfig,
    expected_keys: set[str] | None,
    scan: ShardScanStats,
    workers: MergeWorkers,
) -> tuple[dict[str, FinalRecord], dict[str, Any]]:
    """``choose_finals`` over the whole run, in a part per worker."""
    processes = workers.processes
    shards = run.list_shards()
    file_order = {entry.path: i for i, entry in enumerate(shards)}
    parts = [shards[i::processes] for i in range(processes)]  # any split: ranks carry the global order
    finals: dict[str, FinalRecord] = {}
    counts: dict[str, Any] = {}
    jobs = [(str(run.local_path), part, file_order, filters, expected_keys) for part in parts if part]
    for part_finals, part_counts, part_scan in _ordered(workers.pool, _finals_part, jobs, len(jobs)):
        for name, value in part_counts.items():
            counts[name] = counts.get(name, 0) + value
        scan.add(part_scan)
        for key, final in part_finals.items():
            current = finals.get(key)
            if current is not None:
                counts["attempts_superseded"] += 1
                if final.rank <= current.rank:
                    continue
            finals[key] = final
    return finals, counts


# ------------------------------------------------------------------------------------------ pass 2


def _row_groups(finals: list[FinalRecord]) -> Iterator[list[FinalRecord]]:
    """The row groups ``merge._Pass2.write_data`` cuts: 256 records or 64 MB of JSON, whichever first."""
    group: list[FinalRecord] = []
    size = 0
    for final in finals:
        group.append(final)
        size += final.pos.length
        if len(group) >= _ROW_GROUP_RECORDS or size >= _ROW_GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


def _group_job(
    run_path: str, kind: str, finals: list[FinalRecord], digests: DigestCache | None = None
) -> tuple[bytes, pa.Table | None, StatsAccumulator]:
    """One group: its JSONL bytes, its Arrow table (``data/`` only) and its statistics. The rows and
    summaries come from the shards' digests (pass 1 built them), else from the records themselves."""
    run = RunDir.of(run_path)
    rows = (digests or DigestCache(run)).rows([final.pos for final in finals], data_rows=kind == KEPT)
    stats = StatsAccumulator()
    lines: list[bytes] = []
    records: list[dict[str, Any]] = []
    with RecordReader(run_dir=run) as reader:
        for i, final in enumerate(finals):
            line = reader.read_line(final.pos)
            if rows is None:
                records.append(json.loads(line))
                summary = summarize(records[-1])
            else:
                digest, row = rows[i]
                summary = digest.summary(row)
            stats.add(summary, final.outcome, final.reason)
            if kind == REJECTED:
                line = _with_reason(line, final.reason)
            lines.append(line + b"\n")
    table = None
    if kind == KEPT:
        table = to_arrow_table(records) if rows is None else gather_rows(rows)
    return b"".join(lines), table, stats


def _with_reason(line: bytes, reason: str | None) -> bytes:
    record = json.loads(line)
    record["rejection_reason"] = reason
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def parallel_write(
    run: RunDir,
    by_outcome: dict[str, list[FinalRecord]],
    built: Path,
    per_shard: int,
    stats: StatsAccumulator,
    workers: MergeWorkers,
) -> int:
    """What ``_Pass2.write_data`` and ``write_jsonl`` write, the groups built by the workers; adds to
    ``stats``. Returns the number of ``data/`` shards."""
    data = list(_chunks(by_outcome[KEPT], per_shard)) or [[]]
    files: list[tuple[str, Path, list[FinalRecord]]] = [
        (KEPT, built / DATA_DIR / f"train-{i:05d}-of-{len(data):05d}", shard) for i, shard in enumerate(data)
    ]
    for kind, folder in ((REJECTED, REJECTED_DIR), (FAILED, FAILED_DIR)):
        files += [
            (kind, built / folder / f"{kind}-{i:05d}", shard)
            for i, shard in enumerate(_chunks(by_outcome[kind], per_shard))
        ]
    run_path, pool, processes = str(run.local_path), workers.pool, workers.processes
    if len(data) >= processes:  # a data file per worker at a time: the driver only sums statistics
        jobs = ((run_path, kind, stem, shard) for kind, stem, shard in files)
        for file_stats in _ordered(pool, _file_job, jobs, 2 * processes):
            stats.merge(file_stats)
    else:  # few files: row groups spread, written here in order
        groups = ((run_path, kind, group) for kind, _, shard in files for group in _row_groups(shard))
        results = _ordered(pool, _group_job, groups, 2 * processes)
        for kind, stem, shard in files:
            count = sum(1 for _ in _row_groups(shard))
            _write_file(kind, stem, itertools.islice(results, count), stats)
    return len(data)


def _file_job(run_path: str, kind: str, stem: Path, finals: list[FinalRecord]) -> StatsAccumulator:
    """One whole output file, written by a worker; its statistics."""
    stats = StatsAccumulator()
    digests = DigestCache(RunDir.of(run_path))  # a file's groups share its shards' digests
    groups = (_group_job(run_path, kind, group, digests) for group in _row_groups(finals))
    _write_file(kind, stem, groups, stats)
    return stats


def _write_file(
    kind: str,
    stem: Path,
    results: Iterable[tuple[bytes, pa.Table | None, StatsAccumulator]],
    stats: StatsAccumulator,
) -> None:
    parquet = None
    if kind == KEPT:
        parquet = pq.ParquetWriter(stem.with_suffix(".parquet"), SCHEMA, **PARQUET_OPTIONS)
    try:
        with open(stem.with_suffix(".jsonl"), "wb") as jsonl:
            for lines, table, group_stats in results:
                jsonl.write(lines)
                if parquet is not None and table is not None:
                    parquet.write_table(table)
                stats.merge(group_stats)
            jsonl.flush()
            os.fsync(jsonl.fileno())
    finally:
        if parquet is not None:
            parquet.close()
