"""Shard digests: a closed shard's records already summarized and turned into ``data/`` rows, so the merge
at the end of a large run reads columns instead of parsing JSON twice (issue 27).

Why: the merge spent ~0.24 ms of CPU per record (parse and summarize in pass 1; parse, summarize and
build the Parquet row again in pass 2): 204 s after the last of a million sessions on this machine. A
shard never changes once closed, so that work can be done while the run goes on (``Compactor``) and by
the merge's pass 1 for the shards the run did not reach; pass 2 then only gathers rows.

A digest is two Arrow IPC files in ``RUN_DIR/work/digests/``, derived from its shard alone:
``<shard>.rows.arrow`` holds one ``data/`` row (``schema.SCHEMA``, lz4) per valid record, and
``<shard>.index.arrow`` (written last; small and uncompressed, as pass 1 reads only it) each row's line
offset and length and its ``SessionSummary`` pickled, with the shard's size and modification time and
what reading it met (lines that were not JSON, records that were not valid) in its metadata. A digest
whose shard changed since (the run's open shard grows until full), or whose files cannot be read or do
not belong together, is never used: the merge reads the shard itself, so a digest can only make the
merge quicker, never different (tests/output/test_digests.py).
Digests are a cache: ``work/digests`` may be deleted at any time.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from pathlib import Path
from typing import Any

import pyarrow as pa

from raygen.output.run_dir import SHARDS_DIR, RunDir, is_shard_name
from raygen.output.schema import SCHEMA, to_arrow_table
from raygen.output.shards import MAX_LOGGED_BAD_LINES, ShardPos, ShardScanStats, iter_shard_records
from raygen.output.storage import Entry
from raygen.output.summary import INVALID_RECORD_ERRORS, SessionSummary, summarize

logger = logging.getLogger(__name__)

DIGESTS_DIR = "digests"
_OFFSET, _LENGTH, _SUMMARY = "_offset", "_length", "_summary"
_ROWS_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
_INDEX_OPTIONS = pa.ipc.IpcWriteOptions()  # uncompressed: pass 1 maps it and reads three columns


def digest_path(run: RunDir, shard_name: str) -> Path:
    """A digest's index file: positions, summaries and the shard's stamp (written last)."""
    return run.work_dir() / DIGESTS_DIR / f"{shard_name}.index.arrow"


def rows_path(run: RunDir, shard_name: str) -> Path:
    """A digest's rows file: the ``data/`` rows, lz4-compressed, in the index's order."""
    return run.work_dir() / DIGESTS_DIR / f"{shard_name}.rows.arrow"


def _read_ipc(path: Path) -> tuple[pa.Table, dict[str, Any]]:
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    return table, json.loads(table.schema.metadata[b"raygen_digest"])


class Digest:
    """One shard's digest. Pass 1 needs only the index (small, uncompressed, memory-mapped); the rows
    are read when pass 2 takes them."""

    def __init__(self, index: pa.Table, meta: dict[str, Any], rows_file: Path):
        self.index, self.meta, self.rows_file = index, meta, rows_file
        self._row_of: dict[int, int] | None = None
        self._blobs: list[bytes] | None = None
        self._rows: pa.Table | None = None

    def add_scan(self, scan: ShardScanStats, path: str) -> None:
        """What reading the shard itself would have added to ``scan``."""
        scan.files += 1
        scan.records += self.meta["records"]
        scan.unparseable_lines += self.meta["unparseable"]
        for offset, length in self.meta["bad_positions"]:
            if len(scan.bad_positions) < MAX_LOGGED_BAD_LINES:
                scan.bad_positions.append(ShardPos(path, offset, length))
                logger.warning("skipping unparseable shard line %s @%d", path, offset)

    def summaries(self, path: str) -> Iterator[tuple[SessionSummary | Exception, ShardPos]]:
        """Each record's summary (or why it is not a valid record) with its position."""
        columns = (self.index.column(name).to_pylist() for name in (_OFFSET, _LENGTH, _SUMMARY))
        for offset, length, blob in zip(*columns, strict=True):
            yield pickle.loads(blob), ShardPos(path, offset, length)
        for offset, length, error in self.meta["invalid"]:
            yield ValueError(error), ShardPos(path, offset, length)

    def row(self, offset: int) -> int | None:
        """The row of the record whose line starts at ``offset``."""
        if self._row_of is None:
            self._row_of = {off: i for i, off in enumerate(self.index.column(_OFFSET).to_pylist())}
        return self._row_of.get(offset)

    def summary(self, row: int) -> SessionSummary:
        if self._blobs is None:  # one conversion: an Arrow scalar a row cost ~5x more (pass 2's profile)
            self._blobs = self.index.column(_SUMMARY).to_pylist()
        summary: SessionSummary = pickle.loads(self._blobs[row])
        return summary

    def rows(self) -> pa.Table | None:
        """The ``data/`` rows, or None if the rows file is not this index's (torn, or a later build's)."""
        if self._rows is None:
            try:
                table, meta = _read_ipc(self.rows_file)
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
                return None
            if meta != {"size": self.meta["size"], "mtime_ns": self.meta["mtime_ns"]}:
                return None
            self._rows = table
        return self._rows


def load_digest(run: RunDir, shard_path: str, size: int, mtime_ns: int) -> Digest | None:
    """The digest of the shard at ``shard_path`` as it is now (``size``, ``mtime_ns``), or None."""
    name = os.path.basename(shard_path)
    try:
        index, meta = _read_ipc(digest_path(run, name))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    if meta.get("size") != size or meta.get("mtime_ns") != mtime_ns:
        return None  # the shard changed since, or another run's shard had this name
    return Digest(index, meta, rows_path(run, name))


def load_digest_of(run: RunDir, entry: Entry) -> Digest | None:
    return load_digest(run, entry.path, entry.size, entry.mtime_ns)


def build_digest(run: RunDir, entry: Entry) -> Digest | None:
    """Read the shard ``entry`` and write its digest; None where it cannot be built (the merge then
    reads the shard: a newer record format, a record the ``data/`` schema refuses, a full disk)."""
    scan = ShardScanStats()
    records, offsets, lengths, summaries = [], [], [], []
    invalid: list[tuple[int, int, str]] = []
    fingerprints: set[str] = set()
    try:
        for record, pos in iter_shard_records(run, scan, [entry], log_bad_lines=False):
            try:
                summary = summarize(record)
            except INVALID_RECORD_ERRORS as exc:
                invalid.append((pos.offset, pos.length, str(exc)))
                continue
            records.append(record)
            if record.get("config_fingerprint"):
                fingerprints.add(str(record["config_fingerprint"]))
            offsets.append(pos.offset)
            lengths.append(pos.length)
            summaries.append(pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL))
        stamp = {"size": entry.size, "mtime_ns": entry.mtime_ns}
        _write(rows_path(run, entry.name), to_arrow_table(records), stamp, _ROWS_OPTIONS)
        index = pa.table(
            {
                _OFFSET: pa.array(offsets, pa.int64()),
                _LENGTH: pa.array(lengths, pa.int64()),
                _SUMMARY: pa.array(summaries, pa.binary()),
            }
        )
        meta = {
            **stamp,
            "records": scan.records,
            "unparseable": scan.unparseable_lines,
            "bad_positions": [[p.offset, p.length] for p in scan.bad_positions],
            "invalid": invalid,
            "config_fingerprints": sorted(fingerprints),  # for a resume's ledger (iter_summaries)
        }
        _write(digest_path(run, entry.name), index, meta, _INDEX_OPTIONS)  # last: the digest is complete
    except Exception as exc:  # a digest is only a shortcut: the merge reads the shard
        logger.debug("no digest for %s: %s", entry.path, exc)
        return None
    return Digest(index, meta, rows_path(run, entry.name))


def _write(path: Path, table: pa.Table, meta: dict[str, Any], options: pa.ipc.IpcWriteOptions) -> None:
    # Atomic (temp + rename), not fsynced: a digest torn by a crash fails to load and is rebuilt.
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.replace_schema_metadata({"raygen_digest": json.dumps(meta)})
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with pa.OSFile(str(temp), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as out:
        out.write_table(table)
    os.replace(temp, path)


def digest_shards(run_path: str, entries: list[Entry]) -> int:
    """Build the digests ``entries`` lack (a worker's job); how many were built."""
    run = RunDir.of(run_path)
    return sum(
        load_digest_of(run, entry) is None and build_digest(run, entry) is not None for entry in entries
    )


def iter_summaries(
    run: RunDir,
    scan: ShardScanStats,
    entries: list[Entry],
    build: bool,
    fingerprints: set[str] | None = None,
) -> Iterator[tuple[SessionSummary | Exception, ShardPos]]:
    """Every record's summary (or why it is invalid) with its position, shard by shard: from the shard's
    digest, or built now (``build``), or from the shard itself. Adds to ``scan`` as reading does.

    With ``fingerprints`` (a resume's ledger), the valid records' ``config_fingerprint`` are added to it,
    and a digest from before digests held them counts as missing."""
    for entry in entries:
        digest = load_digest_of(run, entry) if run.is_local else None
        if digest is not None and fingerprints is not None and "config_fingerprints" not in digest.meta:
            digest = None
        scan.digests_reused += digest is not None
        if digest is None and build and run.is_local:
            digest = build_digest(run, entry)
            scan.digests_built += digest is not None
        if digest is not None:
            if fingerprints is not None:
                fingerprints.update(digest.meta["config_fingerprints"])
            digest.add_scan(scan, entry.path)
            yield from digest.summaries(entry.path)
            continue
        for record, pos in iter_shard_records(run, scan, [entry]):
            try:
                summary = summarize(record)
            except INVALID_RECORD_ERRORS as exc:
                yield exc, pos
                continue
            if fingerprints is not None and record.get("config_fingerprint"):
                fingerprints.add(str(record["config_fingerprint"]))
            yield summary, pos


class DigestCache:
    """Digests by shard path for pass 2, the few most recently used kept open."""

    def __init__(self, run: RunDir, keep: int = 64):
        self.run, self.keep = run, keep
        self._digests: dict[str, Digest | None] = {}

    def get(self, shard_path: str) -> Digest | None:
        if shard_path in self._digests:
            digest = self._digests.pop(shard_path)
        else:
            if len(self._digests) >= self.keep:
                self._digests.pop(next(iter(self._digests)))
            try:
                stat = os.stat(shard_path)
            except OSError:
                return None
            digest = load_digest(self.run, shard_path, stat.st_size, stat.st_mtime_ns)
        self._digests[shard_path] = digest  # re-insert: dict order is the LRU order
        return digest

    def rows(self, positions: list[ShardPos], data_rows: bool = True) -> list[tuple[Digest, int]] | None:
        """Each position's digest and row, or None if any has none (with ``data_rows``: or none whose
        ``data/`` rows can be read; rejected and failed records need only the summaries)."""
        found: list[tuple[Digest, int]] = []
        for pos in positions:
            digest = self.get(pos.path)
            row = None if digest is None else digest.row(pos.offset)
            if digest is None or row is None or (data_rows and digest.rows() is None):
                return None
            found.append((digest, row))
        return found


def gather_rows(rows: list[tuple[Digest, int]]) -> pa.Table:
    """The ``data/`` rows at ``rows``, in that order, as one table with exactly ``SCHEMA``. A run of
    consecutive rows of one digest is a slice (no copy); others are taken (the output's prompt order is
    rarely the order sessions finished in, so taking is the common case)."""
    parts: list[pa.Table] = []
    start = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end][0] is not rows[start][0]:
            table = rows[start][0].rows()
            assert table is not None  # DigestCache.rows checked it
            wanted = [row for _, row in rows[start:end]]
            if wanted == list(range(wanted[0], wanted[0] + len(wanted))):
                parts.append(table.slice(wanted[0], len(wanted)))
            else:
                parts.append(table.take(pa.array(wanted, pa.int64())))
            start = end
    if not parts:
        return SCHEMA.empty_table()
    return pa.concat_tables(parts).replace_schema_metadata(SCHEMA.metadata)


class Compactor:
    """During a run: the digest of every shard that has not changed for ``settle_s``, built on the
    merge's workers one batch at a time (so at most one core goes to it), until ``stop``.

    Runs in a thread of the driver; never stops the run (a failing batch is logged and left to the
    merge). ``stop`` waits for the batch in hand (well under a second's work)."""

    def __init__(
        self, run: RunDir, pool: Any, settle_s: float = 5.0, interval_s: float = 2.0, batch: int = 32
    ):
        self.run, self.pool = run, pool
        self.settle_s, self.interval_s, self.batch = settle_s, interval_s, batch
        self.built = 0
        self._seen: set[str] = set()
        """Shards digested (or tried) by this compactor."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="raygen-compactor", daemon=True)

    def __enter__(self) -> Compactor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self.compact_settled()
            except Exception as exc:  # never the run's end: the merge digests what this leaves
                logger.warning("digesting shards during the run failed (the merge will): %s", exc)
                if isinstance(exc, BrokenProcessPool):
                    return  # a worker died: every later job would fail the same way

    def compact_settled(self) -> None:
        """One round: the shards settled since the last, in batches, until done or stopped."""
        due = self._settled_new_shards()
        for start in range(0, len(due), self.batch):
            if self._stopping.is_set():
                return
            batch = due[start : start + self.batch]
            self.built += self.pool.submit(digest_shards, str(self.run.local_path), batch).result()
            self._seen.update(entry.name for entry in batch)

    def _settled_new_shards(self) -> list[Entry]:
        """Shards not digested yet that have not changed for ``settle_s``, oldest first. Only their
        names are listed for the others (a million-sample run has ~16,000 shards; statting them all
        every round cost the driver's thread ~0.03 ms a session): a digested shard that changes later
        (rare once settled) is caught by the merge, which checks every digest against its shard."""
        settled_before = time.time_ns() - int(self.settle_s * 1e9)
        due: list[Entry] = []
        with os.scandir(self.run.local_path / SHARDS_DIR) as listing:
            for item in listing:
                if item.name in self._seen or not is_shard_name(item.name):
                    continue
                with suppress(OSError):  # gone since the listing: nothing to digest
                    stat = item.stat()
                    if stat.st_mtime_ns < settled_before:
                        due.append(Entry(item.path, item.name, stat.st_mtime_ns, stat.st_size))
        return sorted(due, key=lambda entry: (entry.mtime_ns, entry.name))
