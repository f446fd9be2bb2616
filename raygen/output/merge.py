"""The merge: raw shards -> ``data/`` (Parquet + JSONL), ``rejected/``, ``failed/``, ``statistics.json``.

Pass 1 streams every shard record and keeps, per sample key, only the position and rank of its best
record so far (no record bodies, no summaries). The FINAL attempt of a key is the record with the
highest ``(not failed, attempt, rescored, shard order, line offset)``: a non-failed record beats any
failed one, then the highest attempt wins, then the latest ``raygen rescore`` of it
(``verification.rescored``, written in the record, so a copy of the run that lost its files' dates
merges the same), then the record from the later shard (``shards.list_shards``: newer modification
time, then name) and the later line. Pass 2 re-reads each final record once by position,
summarizes it for the statistics and writes it out in ``(prompt_index, sample_key)`` order.

Atomicity: the outputs are built in ``RUN_DIR/.merge-<token>/`` and each folder is then swapped in
(old renamed away, new renamed in, old deleted); ``statistics.json`` is replaced last. A crash leaves
each folder either old or new; the next merge restores or deletes the leftovers. On an object store (no
rename) the outputs are built in a local temp folder and uploaded file by file, each file one atomic put,
then the files of the previous merge that the new one does not have are deleted: a crash can leave a
folder with files of both merges, which the next merge (``raygen merge``) replaces. The shards are only
read, so the merge can be re-run at any time (e.g. with other filters). Two merges of the same run at
once are not supported.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from raygen.config import FilterConfig
from raygen.output.card import dataset_card
from raygen.output.digests import iter_summaries
from raygen.output.filters import FAILED, KEPT, REJECTED, classify
from raygen.output.groups import apply_group_filters
from raygen.output.hermes import HermesOptions, HermesWriter
from raygen.output.merge_folders import abandon, build_folder, publish, recover_leftovers
from raygen.output.run_dir import (
    DATA_DIR,
    FAILED_DIR,
    REJECTED_DIR,
    STATISTICS_FILE,
    TRAJECTORIES_FILE,
    RunDir,
)
from raygen.output.schema import PARQUET_OPTIONS, SCHEMA, to_arrow_table
from raygen.output.shards import RecordReader, ShardPos, ShardScanStats
from raygen.output.stats import StatsAccumulator
from raygen.output.storage import TMP_SUFFIX, Entry
from raygen.output.summary import summarize

if TYPE_CHECKING:  # merge_parallel builds on this module
    from raygen.output.merge_parallel import MergeWorkers

logger = logging.getLogger(__name__)

# Parquet row groups are cut by record count or JSON size, whichever first, so one huge record batch
# never has to sit in memory (nor overflow a 2 GiB Arrow string array).
_ROW_GROUP_RECORDS = 256
_ROW_GROUP_BYTES = 64 << 20


@dataclass(slots=True)
class FinalRecord:
    """The record that stands for a sample key: rank = (not failed, attempt, rescored, shard order,
    offset)."""

    rank: tuple[bool, int, int, int, int]
    pos: ShardPos
    prompt_index: int
    outcome: str
    reason: str | None
    # For the group filters (raygen.output.groups): a few bytes per key, not the summary.
    key: str = ""
    group_id: str | None = None
    sample_index: int = 0
    reward: float | None = None

    def __reduce__(self) -> tuple[type[FinalRecord], tuple[Any, ...]]:
        # Pickled by the million between the merge's workers and the driver: rebuilding from the
        # constructor's arguments pickles in half the time of the slots dataclass's own state methods.
        fields = (self.rank, self.pos, self.prompt_index, self.outcome, self.reason, self.key)
        return FinalRecord, (*fields, self.group_id, self.sample_index, self.reward)


@dataclass
class MergeResult:
    """What one merge wrote."""

    kept: int
    rejected: int
    failed: int
    keys: int
    """Distinct sample keys merged (== kept + rejected + failed)."""
    data_shards: int
    records_read: int
    unparseable_lines: int
    invalid_records: int
    """JSON objects without a usable ``sample_key``/``prompt_index``."""
    stale: int
    """Records ignored because their key is not in ``expected_keys``."""
    attempts_superseded: int
    """Records of a key that lost to its final attempt."""
    missing: int | None
    """Expected keys with no record at all (None when ``expected_keys`` was not given)."""
    spent_usd: float = 0.0
    """What every attempt recorded cost, superseded ones and earlier passes and resumes included."""
    stats: dict[str, Any] = field(default_factory=dict)
    """The content of ``statistics.json``."""


def choose_finals(
    run_dir: RunDir | Path,
    filters: FilterConfig,
    expected_keys: set[str] | None,
    scan: ShardScanStats,
    shards: list[Entry] | None = None,
    file_order: dict[str, int] | None = None,
    build_digests: bool = False,
) -> tuple[dict[str, FinalRecord], dict[str, int]]:
    """Pass 1 over every shard, or over ``shards`` (a part of ``list_shards`` with ``file_order``, each
    path's place in the whole list: a parallel merge, ``merge_parallel.py``). Reads each shard's digest
    where it has a fresh one, and with ``build_digests`` builds those missing (``digests.py``)."""
    finals: dict[str, FinalRecord] = {}
    file_order = {} if file_order is None else file_order
    counts = {"records_read": 0, "invalid_records": 0, "stale": 0, "attempts_superseded": 0, "spent_usd": 0.0}
    run = RunDir.of(run_dir)
    entries = run.list_shards() if shards is None else shards
    for summary, pos in iter_summaries(run, scan, entries, build=build_digests):
        counts["records_read"] += 1
        if isinstance(summary, Exception):
            counts["invalid_records"] += 1
            logger.warning("skipping invalid record %s @%d: %s", pos.path, pos.offset, summary)
            continue
        key = summary.sample_key
        counts["spent_usd"] += summary.cost_usd  # paid for, whether or not the merge keeps it
        if expected_keys is not None and key not in expected_keys:
            counts["stale"] += 1
            continue
        order = file_order.setdefault(pos.path, len(file_order))
        rank = (not summary.failed, summary.attempt, summary.rescored, order, pos.offset)
        current = finals.get(key)
        if current is not None:
            counts["attempts_superseded"] += 1
            if rank <= current.rank:
                continue
        outcome, reason = classify(summary, filters)
        finals[key] = FinalRecord(
            rank,
            pos,
            summary.prompt_index,
            outcome,
            reason,
            key,
            summary.group_id,
            summary.sample_index,
            summary.reward,
        )
    return finals, counts


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _write_fsynced(path: Path, chunks: Iterable[bytes]) -> None:
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


class _Pass2:
    """Re-reads final records by position, feeds the statistics and writes the output files."""

    def __init__(self, reader: RecordReader, filters: FilterConfig, hermes: HermesWriter | None = None):
        self.reader, self.filters = reader, filters
        self.stats = StatsAccumulator()
        self.hermes = hermes

    def _load(self, final: FinalRecord) -> tuple[bytes, dict[str, Any]]:
        line = self.reader.read_line(final.pos)
        record = json.loads(line)
        # Stats come from the record as written; the outcome is the one pass 1 decided.
        self.stats.add(summarize(record), final.outcome, final.reason)
        if self.hermes is not None:
            self.hermes.add(record, kept=final.outcome == KEPT, failed=final.outcome == FAILED)
        return line, record

    def write_data(self, finals: list[FinalRecord], out: Path, per_shard: int) -> int:
        shards = list(_chunks(finals, per_shard)) or [[]]
        for i, shard in enumerate(shards):
            stem = out / f"train-{i:05d}-of-{len(shards):05d}"
            with (
                pq.ParquetWriter(stem.with_suffix(".parquet"), SCHEMA, **PARQUET_OPTIONS) as parquet,
                open(stem.with_suffix(".jsonl"), "wb") as jsonl,
            ):
                batch: list[dict[str, Any]] = []
                batch_bytes = 0
                for final in shard:
                    line, record = self._load(final)
                    jsonl.write(line + b"\n")  # the record exactly as the worker wrote it
                    batch.append(record)
                    batch_bytes += len(line)
                    if len(batch) >= _ROW_GROUP_RECORDS or batch_bytes >= _ROW_GROUP_BYTES:
                        parquet.write_table(to_arrow_table(batch))
                        batch, batch_bytes = [], 0
                # An empty shard gets the schema and NO row group: ``datasets`` sizes its read batches
                # from the first row group and fails on an empty one.
                if batch:
                    parquet.write_table(to_arrow_table(batch))
                jsonl.flush()
                os.fsync(jsonl.fileno())
        return len(shards)

    def write_jsonl(self, finals: list[FinalRecord], out: Path, prefix: str, per_shard: int) -> None:
        for i, shard in enumerate(_chunks(finals, per_shard)):
            _write_fsynced(out / f"{prefix}-{i:05d}.jsonl", (self._line(f) for f in shard))

    def _line(self, final: FinalRecord) -> bytes:
        line, record = self._load(final)
        if final.outcome == REJECTED:
            record["rejection_reason"] = final.reason
            line = json.dumps(record, ensure_ascii=False).encode("utf-8")
        return line + b"\n"


def _by_outcome(finals: dict[str, FinalRecord]) -> dict[str, list[FinalRecord]]:
    """The final records per outcome, each list in ``(prompt_index, sample_key)`` order."""
    by_outcome: dict[str, list[FinalRecord]] = {KEPT: [], REJECTED: [], FAILED: []}
    for _key, final in sorted(finals.items(), key=lambda kv: (kv[1].prompt_index, kv[0])):
        by_outcome[final.outcome].append(final)
    return by_outcome


def _add_merge_statistics(
    stats: dict[str, Any], counts: dict[str, Any], scan: ShardScanStats, missing: int | None
) -> None:
    """What every attempt cost (superseded ones too), and what the merge read."""
    stats["cost"]["total_usd"] = counts["spent_usd"]
    stats["cost"]["superseded_usd"] = max(0.0, counts["spent_usd"] - stats["cost"]["final_usd"])
    stats["merge"] = {
        **counts,
        "unparseable_lines": scan.unparseable_lines,
        "shard_files": scan.files,
        "shard_digests": {"reused": scan.digests_reused, "built": scan.digests_built},
        "missing": missing,
    }


def _merged(
    by_outcome: dict[str, list[FinalRecord]],
    data_shards: int,
    scan: ShardScanStats,
    missing: int | None,
    stats: dict[str, Any],
    counts: dict[str, Any],
) -> MergeResult:
    result = MergeResult(
        kept=len(by_outcome[KEPT]),
        rejected=len(by_outcome[REJECTED]),
        failed=len(by_outcome[FAILED]),
        keys=sum(len(v) for v in by_outcome.values()),
        data_shards=data_shards,
        unparseable_lines=scan.unparseable_lines,
        missing=missing,
        stats=stats,
        **counts,
    )
    logger.info(
        "merged %d keys: %d kept, %d rejected, %d failed",
        result.keys,
        result.kept,
        result.rejected,
        result.failed,
    )
    return result


def _pass1(
    run: RunDir,
    filters: FilterConfig,
    expected_keys: set[str] | None,
    scan: ShardScanStats,
    workers: MergeWorkers | None,
) -> tuple[dict[str, list[FinalRecord]], dict[str, int], int | None]:
    """Pass 1 (on ``workers``, if any): each sample's final record and outcome (group filters applied),
    by outcome; the counts; how many expected keys have no record."""
    from raygen.output.merge_parallel import parallel_finals

    if workers is not None:
        finals, counts = parallel_finals(run, filters, expected_keys, scan, workers)
    else:
        finals, counts = choose_finals(run, filters, expected_keys, scan)
    apply_group_filters(finals.values(), filters)  # --groups, --best-of: need every sample's outcome
    missing = None if expected_keys is None else len(expected_keys - finals.keys())
    return _by_outcome(finals), counts, missing


def _write_outcomes(
    run: RunDir,
    by_outcome: dict[str, list[FinalRecord]],
    built: Path,
    filters: FilterConfig,
    hermes_writer: HermesWriter | None,
    per_shard: int,
    workers: MergeWorkers | None,
) -> tuple[_Pass2, int]:
    """Pass 2: the kept, rejected and failed records into the folders being built (on ``workers``, if
    any); the writer (its statistics) and the number of data shards."""
    from raygen.output.merge_parallel import parallel_write

    with RecordReader(run_dir=run) as reader:
        writer = _Pass2(reader, filters, hermes_writer)
        if workers is not None:
            return writer, parallel_write(run, by_outcome, built, per_shard, writer.stats, workers)
        data_shards = writer.write_data(by_outcome[KEPT], built / DATA_DIR, per_shard)
        writer.write_jsonl(by_outcome[REJECTED], built / REJECTED_DIR, REJECTED, per_shard)
        writer.write_jsonl(by_outcome[FAILED], built / FAILED_DIR, FAILED, per_shard)
    return writer, data_shards


def merge_run(
    run_dir: RunDir | str | os.PathLike,
    filters: FilterConfig,
    data_shard_records: int,
    expected_keys: set[str] | None = None,
    hermes: HermesOptions | None = None,
    processes: int | None = None,
    workers: MergeWorkers | None = None,
) -> MergeResult:
    """Merge ``RUN_DIR/shards`` into the output folders; see the module docstring.

    ``expected_keys`` restricts the merge to those sample keys (records of other keys count as
    ``stale``), e.g. to the current dataset when a run folder is reused. ``hermes`` also writes the kept
    records in the reference runner's format to ``RUN_DIR/trajectories.jsonl`` and adds its keys to the
    statistics (``raygen.output.hermes``); without it a ``trajectories.jsonl`` of an earlier merge is
    removed, so it never disagrees with ``data/``. ``processes``: worker processes for both passes (the
    same output; ``merge_parallel.py``), by default as many as the cores for a large local run;
    ``workers``: processes forked earlier for it (``MergeWorkers.fork``), used when it runs in parallel.
    """
    from raygen.output.merge_parallel import merge_processes, no_cyclic_gc, workers_for

    if data_shard_records < 1:
        raise ValueError("data_shard_records must be >= 1")
    run = RunDir.of(run_dir)
    if run.is_local:
        recover_leftovers(run.local_path)
    # One set of workers serves both passes (a one-process merge leaves ``workers`` idle).
    with workers_for(merge_processes(run, hermes, processes), workers) as used, no_cyclic_gc():
        return _merge(run, filters, data_shard_records, expected_keys, hermes, used)


def _merge(
    run: RunDir,
    filters: FilterConfig,
    data_shard_records: int,
    expected_keys: set[str] | None,
    hermes: HermesOptions | None,
    workers: MergeWorkers | None,
) -> MergeResult:
    """``merge_run``'s two passes and the swap of the outputs into place."""
    scan = ShardScanStats()
    by_outcome, counts, missing = _pass1(run, filters, expected_keys, scan, workers)

    token = uuid.uuid4().hex[:12]
    built = build_folder(run, token)
    hermes_tmp = (run.local_path if run.is_local else built) / (TRAJECTORIES_FILE + TMP_SUFFIX)
    hermes_writer = HermesWriter(hermes, hermes_tmp) if hermes is not None else None
    try:
        writer, data_shards = _write_outcomes(
            run, by_outcome, built, filters, hermes_writer, data_shard_records, workers
        )
        stats = writer.stats.to_dict()
        if hermes_writer is not None:
            hermes_writer.close()
            total = len(expected_keys) if expected_keys is not None else sum(map(len, by_outcome.values()))
            stats.update(hermes_writer.statistics(total))
        _add_merge_statistics(stats, counts, scan, missing)
        (built / DATA_DIR / "README.md").write_text(dataset_card(stats, filters), encoding="utf-8")
        publish(run, built, token)
        if hermes_writer is not None:
            run.replace_from(hermes_tmp, TRAJECTORIES_FILE)
        else:
            run.delete(TRAJECTORIES_FILE)
    except BaseException:
        abandon(run, built, hermes_writer)
        raise
    if not run.is_local:
        shutil.rmtree(built, ignore_errors=True)
    run.write_json(STATISTICS_FILE, stats)
    return _merged(by_outcome, data_shards, scan, missing, stats, counts)
