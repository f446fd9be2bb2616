"""``RunDir``: the one owner of a run folder's layout and of how its files are written and read.

```
RUN_DIR/
  manifest.json     what produced the run (runner)           statistics.json  the merge's statistics
  keys.txt          the sample keys of the dataset           driver.lock      the driver holding the run
  shards/           attempt records, the ledger (shards.py)  data/ rejected/ failed/   the merge's output
  work/             the pending chunk files of a pass (transient; always on the driver's local disk)
```

A run folder is a local path, a path on a shared filesystem, or an object-store URI (``s3://bucket/prefix``,
``gs://...``); see storage.py for what "atomic" means on each. Every reader and writer of the folder goes
through this class, so a new kind of storage plugs in here and nowhere else. Importing it does not import
pyarrow (``raygen.eval`` reads run folders without it); an object store loads ``pyarrow.fs`` when opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePath, PurePosixPath
from typing import IO, Any

from raygen.errors import ConfigError
from raygen.output.storage import Entry, Storage, fsync_dir, is_object_store, open_storage

MANIFEST_FILE = "manifest.json"
STATISTICS_FILE = "statistics.json"
KEYS_FILE = "keys.txt"
LOCK_FILE = "driver.lock"
SHARDS_DIR = "shards"
DATA_DIR, REJECTED_DIR, FAILED_DIR = "data", "rejected", "failed"
OUTPUT_DIRS = (DATA_DIR, REJECTED_DIR, FAILED_DIR)
"""The merge's output folders, in the order it writes them."""
WORK_DIR = "work"
TRAJECTORIES_FILE = "trajectories.jsonl"
"""The kept sessions in Hermes Agent's format (``output.format: hermes``, output/hermes.py)."""
REPORT_FILE = "report.html"
"""``raygen report``'s default output."""
TEMPLATE_CHECK_FILE = "template_check.json"
"""The last ``raygen export --check``'s result (raygen/export/check.py), read by ``raygen report``."""
SAMPLE_DIR = "sample"
"""``raygen sample``'s default output folder."""
SHARD_SUFFIX = ".jsonl"


def is_shard_name(name: str) -> bool:
    """Whether a file of ``shards/`` is a final shard (a writer's temp files are hidden)."""
    return name.endswith(SHARD_SUFFIX) and not name.startswith(".")


class RunDir:
    """One run folder, wherever it lives. ``str(run_dir)`` is the location as given (for messages)."""

    def __init__(self, location: str | os.PathLike, retry_s: float | None = None):
        """``retry_s``: how long object-store writes wait for an unreachable store (default 60 s)."""
        text = os.fspath(location)
        self.location = text.rstrip("/") if is_object_store(text) else text
        self.storage: Storage
        self.storage, self.root = open_storage(self.location)
        if retry_s is not None and not self.storage.local:
            self.storage.retry_s = retry_s

    @classmethod
    def of(cls, where: RunDir | str | os.PathLike) -> RunDir:
        return where if isinstance(where, RunDir) else cls(where)

    @classmethod
    def under(cls, output_dir: str | os.PathLike, run_name: str, retry_s: float | None = None) -> RunDir:
        """``OUTPUT_DIR/RUN_NAME``."""
        parent = os.fspath(output_dir)
        if is_object_store(parent):
            return cls(parent.rstrip("/") + "/" + run_name, retry_s)
        return cls(Path(parent) / run_name, retry_s)

    def __str__(self) -> str:
        return self.location

    def __repr__(self) -> str:
        return f"RunDir({self.location!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to Ray workers by location: each process opens its own storage client.
        return (RunDir, (self.location, self.storage.retry_s))

    def check(self) -> None:
        """``ConfigError`` now, before any model call, if the storage cannot hold the run (no bucket)."""
        self.storage.check(self.root)

    @property
    def is_local(self) -> bool:
        """On a POSIX filesystem (local or shared), as opposed to an object store."""
        return self.storage.local

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.location} is not on a filesystem")
        return Path(self.root)

    @property
    def name(self) -> str:
        return PurePosixPath(self.root).name

    def path(self, *parts: str) -> str:
        """The storage path of a file or folder of the run."""
        return self.storage.join(self.root, *parts)

    def pure_path(self, storage_path: str) -> PurePath:
        """A storage path as a path object (``Path`` when local)."""
        return Path(storage_path) if self.is_local else PurePosixPath(storage_path)

    def describe(self, *parts: str) -> str:
        """A file of the run as the user would write it (URI or path)."""
        return "/".join([self.location.rstrip("/"), *parts])

    # -- presence -------------------------------------------------------------------------------------

    def exists(self, *parts: str) -> bool:
        return self.storage.exists(self.path(*parts))

    def is_empty(self) -> bool:
        """Nothing at all in the folder (or no folder)."""
        if self.is_local:
            return not self.local_path.exists() or not any(self.local_path.iterdir())
        return not self.storage.list(self.root, recursive=True)

    def create(self) -> None:
        """Make the folder (object stores have no folders: nothing to do)."""
        if self.is_local:
            self.local_path.mkdir(parents=True, exist_ok=True)

    # -- small documents ------------------------------------------------------------------------------

    def read_bytes(self, *parts: str) -> bytes:
        return self.storage.read_bytes(self.path(*parts))

    def read_json(self, name: str) -> Any:
        return json.loads(self.read_bytes(name).decode("utf-8"))

    def write_bytes(self, name: str, chunks: Iterable[bytes]) -> None:
        """Replace ``name`` atomically and durably: readers see the old or the new content."""
        self.storage.put(self.path(name), chunks)

    def write_json(self, name: str, body: Any) -> None:
        text = json.dumps(body, indent=2, ensure_ascii=False, default=str) + "\n"
        self.write_bytes(name, [text.encode("utf-8")])

    def require(self, name: str) -> None:
        """``ConfigError`` unless the run folder holds ``name`` (it is not a run folder otherwise)."""
        if not self.exists(name):
            raise ConfigError(f"{self.location} is not a raygen run folder (no {name})")

    def read_manifest(self) -> dict[str, Any]:
        self.require(MANIFEST_FILE)
        return self.read_json(MANIFEST_FILE)

    def write_keys(self, keys: set[str]) -> None:
        self.write_bytes(KEYS_FILE, ["".join(key + "\n" for key in sorted(keys)).encode("utf-8")])

    def read_keys(self) -> set[str]:
        self.require(KEYS_FILE)
        text = self.read_bytes(KEYS_FILE).decode("utf-8")
        return {line.strip() for line in text.splitlines() if line.strip()}

    # -- shards and outputs ---------------------------------------------------------------------------

    def list_shards(self) -> list[Entry]:
        """Final shard files in read order: by modification time, then name (temp and hidden files
        excluded). This order defines "later" for the merge's last tie-break between two records of the
        same key and attempt: the record from the more recently written shard wins."""
        found = [e for e in self.storage.list(self.path(SHARDS_DIR)) if is_shard_name(e.name)]
        return sorted(found, key=lambda e: (e.mtime_ns, e.name))

    def output_files(self, folder: str, suffix: str = ".jsonl") -> list[str]:
        """The files of a merge output folder with ``suffix``, in name order (the merge's write order)."""
        entries = self.storage.list(self.path(folder))
        return sorted(e.path for e in entries if e.name.endswith(suffix) and not e.name.startswith("."))

    def all_files(self) -> list[Entry]:
        """Every file of the run folder except the transient ``work/`` ones."""
        work = self.path(WORK_DIR) + "/"
        return [e for e in self.storage.list(self.root, recursive=True) if not e.path.startswith(work)]

    def relative(self, storage_path: str) -> str:
        """``storage_path`` relative to the run folder."""
        return (
            os.path.relpath(storage_path, self.root) if self.is_local else storage_path[len(self.root) + 1 :]
        )

    def open_stream(self, storage_path: str) -> IO[bytes]:
        return self.storage.open_stream(storage_path)

    def open_seekable(self, storage_path: str) -> IO[bytes]:
        return self.storage.open_seekable(storage_path)

    def publish(self, built: Path, folder: str) -> None:
        """Object stores: make ``folder`` hold the files of the local folder ``built`` (the merge)."""
        self.storage.upload_tree(built, self.path(folder))

    def replace_from(self, local_file: Path, name: str) -> None:
        """Make ``name`` the content of ``local_file`` (a finished temp file, consumed)."""
        if self.is_local:
            os.replace(local_file, self.path(name))
            fsync_dir(self.local_path)
            return
        self.storage.put_file(self.path(name), local_file)
        local_file.unlink()

    def delete(self, name: str) -> None:
        self.storage.delete(self.path(name))

    # -- the driver's local side ----------------------------------------------------------------------

    def work_dir(self) -> Path:
        """Where a pass's pending chunk files go: ``RUN_DIR/work`` on a filesystem; on an object store a
        folder on the driver's local disk (Ray reads the chunks on the driver's node; they are transient)."""
        if self.is_local:
            return self.local_path / WORK_DIR
        digest = hashlib.sha256(self.location.encode("utf-8")).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / "raygen-work" / f"{self.name}-{digest}"
