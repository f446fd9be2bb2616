"""Raw shards: the JSONL files workers append attempt records to, and the tolerant reader the merge uses.

Layout: ``RUN_DIR/shards/<writer_id>-<seq:06d>.jsonl``, one JSON object per line.

Why new files instead of appending: a shard appears under its final name only once complete
(``RunDir`` writes it atomically: temp file + fsync + rename on a filesystem, one put on an object store),
so a worker killed mid-write leaves at most a ``*.tmp`` file, which readers ignore. Many writers on many
nodes never share a file, so no locking is needed on shared storage, and nothing is ever appended to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import IO, Any, NamedTuple

from raygen.formats.records import check_format_version
from raygen.output.run_dir import SHARD_SUFFIX, SHARDS_DIR, RunDir
from raygen.output.storage import Entry

logger = logging.getLogger(__name__)

_WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_LOGGED_BAD_LINES = 5


def jsonl_safe(json_text: str) -> str:
    """Escape U+2028/U+2029 in a JSON text: valid either way, but readers that split lines with
    ``str.splitlines()`` would cut a record in two at a raw one (prompts do contain them)."""
    return json_text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


class ShardPos(NamedTuple):
    """Where one record lives: shard file, byte offset of its line, and the line's length (no newline)."""

    path: str
    offset: int
    length: int


class ShardWriter:
    """Buffers JSON lines and flushes them, each flush to a NEW shard file.

    ``writer_id`` must be unique per worker process and attempt (e.g. ``<node>-<pid>-<uuid8>``); it is
    the file-name prefix, so two writers never touch the same file. Safe to call from several threads;
    from an event loop use ``aadd``/``aflush``/``aclose`` so the disk I/O runs in a thread.
    """

    def __init__(self, run_dir: RunDir | str | os.PathLike, writer_id: str, max_records: int, flush_s: float):
        if not _WRITER_ID.match(writer_id):
            raise ValueError(f"writer_id must match {_WRITER_ID.pattern}: {writer_id!r}")
        if max_records < 1 or flush_s <= 0:
            raise ValueError("max_records must be >= 1 and flush_s > 0")
        self.run_dir = RunDir.of(run_dir)
        if self.run_dir.is_local:
            (self.run_dir.local_path / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        self.writer_id = writer_id
        self.max_records = max_records
        self.flush_s = flush_s
        self._lines: list[str] = []
        self._first_at: float | None = None
        self._seq = 0
        self._closed = False
        self._lock = threading.Lock()
        self.paths: list[PurePath] = []
        """Final shard files written so far, in order."""

    @property
    def pending(self) -> int:
        """Records buffered and not yet on disk."""
        return len(self._lines)

    @property
    def due(self) -> bool:
        """True when the buffer should be flushed (size or age limit reached)."""
        with self._lock:
            if not self._lines or self._first_at is None:
                return False
            age = time.monotonic() - self._first_at
            return len(self._lines) >= self.max_records or age >= self.flush_s

    def _buffer(self, record_json: str) -> None:
        if self._closed:
            raise RuntimeError(f"ShardWriter {self.writer_id} is closed")
        # One record per line is the shard format; a raw newline would split a record in two.
        if "\n" in record_json or "\r" in record_json:
            raise ValueError("record_json must be a single line of JSON")
        with self._lock:
            if not self._lines:
                self._first_at = time.monotonic()
            self._lines.append(record_json)

    def add(self, record_json: str) -> None:
        """Buffer one JSON line; flush (blocking) if the buffer is full or old enough."""
        self._buffer(record_json)
        if self.due:
            self.flush()

    async def aadd(self, record_json: str) -> None:
        """``add`` for event loops: a due flush runs in a thread."""
        self._buffer(record_json)
        if self.due:
            await self.aflush()

    def _take(self) -> tuple[list[str], str] | None:
        # Swap the buffer out under the lock so adds during a threaded write go to the next shard.
        with self._lock:
            if not self._lines:
                return None
            while True:
                path = self.run_dir.path(SHARDS_DIR, f"{self.writer_id}-{self._seq:06d}{SHARD_SUFFIX}")
                # Never overwrite, even a previous process's file. Checked before the buffer is taken:
                # if the storage cannot be read the records stay buffered.
                if not self.run_dir.storage.exists(path):
                    break
                self._seq += 1
            self._seq += 1
            lines, self._lines, self._first_at = self._lines, [], None
            return lines, path

    def _give_back(self, lines: list[str]) -> None:
        with self._lock:
            self._lines[:0] = lines
            self._first_at = time.monotonic()

    def _write(self, lines: list[str], path: str) -> PurePath:
        try:
            self.run_dir.storage.put(path, ["".join(line + "\n" for line in lines).encode("utf-8")])
        except BaseException:
            # Keep the records so a later flush can retry (e.g. after disk space is freed).
            self._give_back(lines)
            raise
        written = self.run_dir.pure_path(path)
        self.paths.append(written)
        return written

    def flush(self) -> PurePath | None:
        """Write the buffer to a new shard; returns its path (None if the buffer was empty)."""
        taken = self._take()
        if taken is None:
            return None
        return self._write(*taken)

    async def aflush(self) -> PurePath | None:
        """``flush`` with the I/O in a worker thread, for callers on an event loop."""
        taken = self._take()
        if taken is None:
            return None
        return await asyncio.to_thread(self._write, *taken)

    def close(self) -> None:
        """Flush what is left; further adds raise."""
        self.flush()
        self._closed = True

    async def aclose(self) -> None:
        """``close`` for event loops."""
        await self.aflush()
        self._closed = True


class RollingShardWriter(ShardWriter):
    """A ``ShardWriter`` whose flushes rewrite the current shard, with the new lines added, until it holds
    ``max_records``: records can be made durable every fraction of a second without leaving a file per
    flush. Each rewrite is as atomic as a new shard (readers see the old file or the new one, never a
    torn one). For one thread at a time (the driver's result loop)."""

    def __init__(self, run_dir: RunDir | str | os.PathLike, writer_id: str, max_records: int, flush_s: float):
        super().__init__(run_dir, writer_id, max_records, flush_s)
        self._open_lines: list[str] = []
        self._open_path: str | None = None

    def _take(self) -> tuple[list[str], str] | None:
        if self._open_path is None:
            return super()._take()
        with self._lock:
            if not self._lines:
                return None
            lines, self._lines, self._first_at = self._lines, [], None
        return self._open_lines + lines, self._open_path

    def _write(self, lines: list[str], path: str) -> PurePath:
        rewrite = path == self._open_path
        try:
            written = super()._write(lines, path)
        except BaseException:
            if rewrite:  # the base class gave back every line; the open shard's are already on disk
                with self._lock:
                    del self._lines[: len(self._open_lines)]
            raise
        if rewrite:
            self.paths.pop()  # listed when the file was first written
        full = len(lines) >= self.max_records
        self._open_lines, self._open_path = ([], None) if full else (lines, path)
        return written


@dataclass
class ShardScanStats:
    """Filled in by ``iter_shard_records`` as it goes."""

    files: int = 0
    records: int = 0
    unparseable_lines: int = 0
    bad_positions: list[ShardPos] = field(default_factory=list)
    """The first few unparseable lines, for messages."""
    digests_reused: int = 0
    """Shards read from a digest built earlier (during the run: ``digests.py``) ..."""
    digests_built: int = 0
    """... and from one the merge built."""

    def add(self, other: ShardScanStats) -> None:
        """Count what ``other`` (another part of the same merge) read."""
        self.files += other.files
        self.records += other.records
        self.unparseable_lines += other.unparseable_lines
        self.bad_positions += other.bad_positions
        self.digests_reused += other.digests_reused
        self.digests_built += other.digests_built


def list_shards(run_dir: RunDir | str | os.PathLike) -> list[Entry]:
    """``RunDir.list_shards``: final shard files in read order (modification time, then name)."""
    return RunDir.of(run_dir).list_shards()


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return None
    return value if isinstance(value, dict) else None


def iter_shard_records(
    run_dir: RunDir | str | os.PathLike,
    stats: ShardScanStats | None = None,
    entries: list[Entry] | None = None,
    log_bad_lines: bool = True,
) -> Iterator[tuple[dict[str, Any], ShardPos]]:
    """Every record of every final shard with its position, in ``list_shards`` order (or of ``entries``,
    a part of that list, e.g. one worker's share of a parallel merge).

    Lines that are not a JSON object are skipped, counted in ``stats`` and logged (unless not
    ``log_bad_lines``: a shard digest records them for the merge to log); blank lines are
    skipped silently. Never raises on bad content; raises ``RecordFormatError`` on a record of a newer
    format (a newer raygen wrote this run: reading on would mis-merge it).
    """
    stats = stats if stats is not None else ShardScanStats()
    run_dir = RunDir.of(run_dir)
    for entry in run_dir.list_shards() if entries is None else entries:
        stats.files += 1
        path_str = entry.path  # one shared str per file keeps millions of positions small
        offset = 0
        with run_dir.open_stream(path_str) as f:
            for number, raw in enumerate(f, start=1):
                line = raw.rstrip(b"\r\n")
                pos = ShardPos(path_str, offset, len(line))
                offset += len(raw)
                if not line.strip():
                    continue
                record = _parse(line)
                if record is None:
                    stats.unparseable_lines += 1
                    if len(stats.bad_positions) < MAX_LOGGED_BAD_LINES:
                        stats.bad_positions.append(pos)
                        if log_bad_lines:
                            logger.warning("skipping unparseable shard line %s @%d", path_str, pos.offset)
                    continue
                check_format_version(record, f"{path_str}:{number}")
                stats.records += 1
                yield record, pos


def read_line(pos: ShardPos) -> bytes:
    """The raw bytes of the record at ``pos`` (no newline)."""
    with open(pos.path, "rb") as f:
        f.seek(pos.offset)
        return f.read(pos.length)


class RecordReader:
    """Re-reads records by position keeping a few files open, for reading many records in any order.

    ``run_dir`` says where the positions' files live (default: the local filesystem)."""

    def __init__(self, max_open: int = 32, run_dir: RunDir | None = None):
        self.max_open = max_open
        self._open: Callable[[str], IO[bytes]] = run_dir.open_seekable if run_dir else _open_local
        self._files: dict[str, Any] = {}

    def read_line(self, pos: ShardPos) -> bytes:
        f = self._files.pop(pos.path, None)
        if f is None:
            if len(self._files) >= self.max_open:
                oldest = next(iter(self._files))
                self._files.pop(oldest).close()
            f = self._open(pos.path)  # kept open across calls; closed in close()
        self._files[pos.path] = f  # re-insert: dict order is the LRU order
        f.seek(pos.offset)
        return f.read(pos.length)

    def read(self, pos: ShardPos) -> dict[str, Any]:
        return json.loads(self.read_line(pos))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_local(path: str) -> IO[bytes]:
    return open(path, "rb")
