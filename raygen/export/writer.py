"""Sharded export files on the run's kind of storage (a path or ``s3://``/``gs://``): JSONL for the
message formats, Parquet for ``tokens``; each shard one atomic put (raygen.output.storage)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from raygen.errors import ConfigError
from raygen.output.run_dir import TEMPLATE_CHECK_FILE
from raygen.output.storage import open_storage

EXPORT_FILE = "export.json"
"""What an export folder holds and how it was made (written last)."""
SHARD_PREFIX = "train-"

TOKENS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("sample_key", pa.string()),
        pa.field("category", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("sample_index", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("exit_status", pa.string()),
        pa.field("is_truncated", pa.bool_()),
        pa.field("has_error", pa.bool_()),
        pa.field("cut", pa.bool_()),
        pa.field("token_source", pa.string()),
        pa.field("turn", pa.int64()),
        pa.field("num_tokens", pa.int64()),
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("response_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("logprobs", pa.list_(pa.float32())),
    ]
)
"""The one schema of every ``tokens`` shard (``datasets`` refuses shards whose schemas differ)."""


SHARD_BYTES = 256 << 20
"""A JSONL shard is closed at this size even before ``rows_per_shard`` rows (memory stays bounded)."""
SHARD_TOKENS = 16_000_000
"""A Parquet (``tokens``) shard is closed at this many ids and logprobs (about 0.6 GB as Python lists)."""


class ShardWriter:
    """Rows in, ``train-NNNNN.{jsonl,parquet}`` out: ``rows_per_shard`` rows a file, fewer when the rows
    are large (``SHARD_BYTES``, ``SHARD_TOKENS``)."""

    def __init__(self, out: str | os.PathLike, parquet: bool, rows_per_shard: int):
        self.storage, self.root = open_storage(out)
        self.parquet, self.rows_per_shard = parquet, rows_per_shard
        self.rows: list[Any] = []
        """Parquet: row dicts; JSONL: encoded lines."""
        self.size = 0
        """What the buffered rows weigh: bytes (JSONL) or ids and logprobs (Parquet)."""
        self.files: list[str] = []
        self.count = 0
        self._prepare()

    def _prepare(self) -> None:
        """The folder must be new, empty, or an earlier export (whose files are replaced)."""
        self.storage.check(self.root)
        entries = [e for e in self.storage.list(self.root) if not e.name.startswith(".")]
        if entries and not any(e.name == EXPORT_FILE for e in entries):
            raise ConfigError(f"{self.path('')}: not empty and not an earlier export; choose another --out")
        for entry in entries:
            if entry.name.startswith(SHARD_PREFIX) or entry.name in (EXPORT_FILE, TEMPLATE_CHECK_FILE):
                self.storage.delete(entry.path)

    def path(self, name: str) -> str:
        return self.storage.join(self.root, name) if name else self.root

    def add(self, row: dict[str, Any]) -> None:
        if self.parquet:
            self.rows.append(row)
            self.size += len(row["prompt_ids"]) + 2 * len(row["response_ids"]) + len(row["logprobs"] or ())
        else:
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
            self.rows.append(line)
            self.size += len(line)
        self.count += 1
        full = self.size >= (SHARD_TOKENS if self.parquet else SHARD_BYTES)
        if full or len(self.rows) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        name = f"{SHARD_PREFIX}{len(self.files):05d}.{'parquet' if self.parquet else 'jsonl'}"
        if self.parquet:
            buffer = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(self.rows, schema=TOKENS_SCHEMA), buffer)
            body = buffer.getvalue()
        else:
            body = b"".join(self.rows)
        self.storage.put(self.path(name), [body])
        self.files.append(name)
        self.rows, self.size = [], 0

    def write_json(self, name: str, body: Any) -> None:
        self.storage.put(
            self.path(name), [json.dumps(body, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"]
        )
