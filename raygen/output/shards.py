"""Raw shards: the JSONL files workers append attempt records to, and the tolerant reader the merge uses.

Layout: ``RUN_DIR/shards/<writer_id>-<seq:06d>.jsonl``, one JSON object per line.

Why new files instead of appending: a shard appears under its final name only once complete
(temp file + fsync + ``os.replace`` + directory fsync), so a worker killed mid-write leaves at most a
``*.tmp`` file, which readers ignore. Many writers on many nodes never share a file, so no locking is
needed on shared storage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

SHARDS_DIR = "shards"
SHARD_SUFFIX = ".jsonl"
TMP_SUFFIX = ".tmp"
_WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MAX_LOGGED_BAD_LINES = 5


def jsonl_safe(json_text: str) -> str:
    """Escape U+2028/U+2029 in a JSON text: valid either way, but readers that split lines with
    ``str.splitlines()`` would cut a record in two at a raw one (prompts do contain them)."""
    return json_text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


class ShardPos(NamedTuple):
    """Where one record lives: shard file, byte offset of its line, and the line's length (no newline)."""

    path: str
    offset: int
    length: int


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames/creations inside ``path`` durable (a no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ShardWriter:
    """Buffers JSON lines and flushes them, each flush to a NEW shard file.

    ``writer_id`` must be unique per worker process and attempt (e.g. ``<node>-<pid>-<uuid8>``); it is
    the file-name prefix, so two writers never touch the same file. Safe to call from several threads;
    from an event loop use ``aadd``/``aflush``/``aclose`` so the disk I/O runs in a thread.
    """

    def __init__(self, run_dir: str | os.PathLike, writer_id: str, max_records: int, flush_s: float):
        if not _WRITER_ID.match(writer_id):
            raise ValueError(f"writer_id must match {_WRITER_ID.pattern}: {writer_id!r}")
        if max_records < 1 or flush_s <= 0:
            raise ValueError("max_records must be >= 1 and flush_s > 0")
        self.dir = Path(run_dir) / SHARDS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer_id = writer_id
        self.max_records = max_records
        self.flush_s = flush_s
        self._lines: list[str] = []
        self._first_at: float | None = None
        self._seq = 0
        self._closed = False
        self._lock = threading.Lock()
        self.paths: list[Path] = []
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

    def _take(self) -> tuple[list[str], Path] | None:
        # Swap the buffer out under the lock so adds during a threaded write go to the next shard.
        with self._lock:
            if not self._lines:
                return None
            lines, self._lines, self._first_at = self._lines, [], None
            while True:
                path = self.dir / f"{self.writer_id}-{self._seq:06d}{SHARD_SUFFIX}"
                self._seq += 1
                if not path.exists():  # never overwrite, even a file a previous process left
                    return lines, path

    def _give_back(self, lines: list[str]) -> None:
        with self._lock:
            self._lines[:0] = lines
            self._first_at = time.monotonic()

    def _write(self, lines: list[str], path: Path) -> None:
        tmp = path.with_name(path.name + TMP_SUFFIX)
        try:
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                f.write("\n".join(lines))
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            # Keep the records so a later flush can retry (e.g. after disk space is freed).
            tmp.unlink(missing_ok=True)
            self._give_back(lines)
            raise
        fsync_dir(self.dir)
        self.paths.append(path)

    def flush(self) -> Path | None:
        """Write the buffer to a new shard; returns its path (None if the buffer was empty)."""
        taken = self._take()
        if taken is None:
            return None
        self._write(*taken)
        return taken[1]

    async def aflush(self) -> Path | None:
        """``flush`` with the I/O in a worker thread, for callers on an event loop."""
        taken = self._take()
        if taken is None:
            return None
        await asyncio.to_thread(self._write, *taken)
        return taken[1]

    def close(self) -> None:
        """Flush what is left; further adds raise."""
        self.flush()
        self._closed = True

    async def aclose(self) -> None:
        """``close`` for event loops."""
        await self.aflush()
        self._closed = True


@dataclass
class ShardScanStats:
    """Filled in by ``iter_shard_records`` as it goes."""

    files: int = 0
    records: int = 0
    unparseable_lines: int = 0
    bad_positions: list[ShardPos] = field(default_factory=list)
    """The first few unparseable lines, for messages."""


def list_shards(run_dir: str | os.PathLike) -> list[Path]:
    """Final shard files in read order: by modification time, then name (temp and hidden files excluded).

    This order defines "later" for the merge's last tie-break between two records of the same key and
    attempt: the record from the more recently written shard wins.
    """
    shard_dir = Path(run_dir) / SHARDS_DIR
    if not shard_dir.is_dir():
        return []
    found = []
    for entry in os.scandir(shard_dir):
        if entry.name.endswith(SHARD_SUFFIX) and not entry.name.startswith(".") and entry.is_file():
            found.append((entry.stat().st_mtime_ns, entry.name, Path(entry.path)))
    return [path for _, _, path in sorted(found)]


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return None
    return value if isinstance(value, dict) else None


def iter_shard_records(
    run_dir: str | os.PathLike, stats: ShardScanStats | None = None
) -> Iterator[tuple[dict[str, Any], ShardPos]]:
    """Every record of every final shard with its position, in ``list_shards`` order.

    Lines that are not a JSON object are skipped, counted in ``stats`` and logged; blank lines are
    skipped silently. Never raises on bad content.
    """
    stats = stats if stats is not None else ShardScanStats()
    for path in list_shards(run_dir):
        stats.files += 1
        path_str = str(path)  # one shared str per file keeps millions of positions small
        offset = 0
        with open(path, "rb") as f:
            for raw in f:
                line = raw.rstrip(b"\r\n")
                pos = ShardPos(path_str, offset, len(line))
                offset += len(raw)
                if not line.strip():
                    continue
                record = _parse(line)
                if record is None:
                    stats.unparseable_lines += 1
                    if len(stats.bad_positions) < _MAX_LOGGED_BAD_LINES:
                        stats.bad_positions.append(pos)
                        logger.warning("skipping unparseable shard line %s @%d", path_str, pos.offset)
                    continue
                stats.records += 1
                yield record, pos


def read_line(pos: ShardPos) -> bytes:
    """The raw bytes of the record at ``pos`` (no newline)."""
    with open(pos.path, "rb") as f:
        f.seek(pos.offset)
        return f.read(pos.length)


def read_record(pos: ShardPos) -> dict[str, Any]:
    """Re-read one record by position (as returned by ``iter_shard_records``)."""
    return json.loads(read_line(pos))


class RecordReader:
    """Re-reads records by position keeping a few files open, for reading many records in any order."""

    def __init__(self, max_open: int = 32):
        self.max_open = max_open
        self._files: dict[str, Any] = {}

    def read_line(self, pos: ShardPos) -> bytes:
        f = self._files.pop(pos.path, None)
        if f is None:
            if len(self._files) >= self.max_open:
                oldest = next(iter(self._files))
                self._files.pop(oldest).close()
            f = open(pos.path, "rb")  # noqa: SIM115 - kept open across calls; closed in close()
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
