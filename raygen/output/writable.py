"""Checks of a run's output location made before the first model call: its name, writability and room.

A bad ``--run-name`` (``../x``, ``..``, ``/abs``) used to write outside ``--output-dir``; an output folder
that is a file, is read-only or sits on a full disk used to fail with a long traceback, a full disk only
after every session had run (and a ``--resume`` spent the model calls again). Each is now one line naming
the path and the cause (a ``ConfigError``), raised before anything runs. The runner calls these for a
local or shared-filesystem run folder; object stores are checked by their storage (``RunDir.check``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from raygen.errors import ConfigError

MIN_FREE_BYTES = 64 * 1024 * 1024
"""Less free space than this under the output folder stops a run before it starts: shards, the merged
Parquet and JSONL and the temporary files of the merge need room, and a disk that fills mid-run loses
the work of every session since the last flush."""


def check_run_name(name: str) -> None:
    """A run name is one folder name under the output folder: not empty, ``.``, ``..``, a path or
    absolute, no NUL. ``ConfigError`` otherwise."""
    problem = None
    if not name or name in (".", ".."):
        problem = "must name a folder"
    elif "/" in name or "\\" in name:
        problem = "must be a single folder name, without '/' (it would be a path)"
    elif "\x00" in name:
        problem = "contains a NUL character"
    if problem:
        raise ConfigError(f"--run-name {name!r} {problem}: it is created inside --output-dir")


def _nearest_existing(path: Path) -> Path:
    current = path
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def check_output_folder(run_dir: Path, min_free_bytes: int = MIN_FREE_BYTES) -> None:
    """``ConfigError`` with one line (the path and the cause) unless ``run_dir`` can be created and written
    and its filesystem has ``min_free_bytes`` free. Leaves nothing behind."""
    existing = _nearest_existing(run_dir.absolute())
    if not existing.is_dir():
        what = "a file" if existing.exists() else "a broken link"
        raise ConfigError(f"output folder {run_dir}: {existing} is {what}, not a folder")
    try:
        # A real write, not os.access: it sees read-only mounts, full disks, quotas, and root's rights.
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".raygen-write-check-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise ConfigError(f"output folder {run_dir}: cannot write in {existing}: {_cause(exc)}") from None
    free = shutil.disk_usage(existing).free
    if free < min_free_bytes:
        raise ConfigError(
            f"output folder {run_dir}: only {free / 2**20:.1f} MiB free on its filesystem "
            f"(at least {min_free_bytes / 2**20:.0f} MiB needed)"
        )


def _cause(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno == errno.EROFS:
        return "read-only filesystem"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Write errors that mean the output storage itself gave out (full, over quota, read-only)."""


def storage_failure(exc: BaseException, output_dir: str | os.PathLike = "the output folder") -> str | None:
    """One line for a write that failed because the output storage gave out during a run, else None
    (any other error keeps its traceback: it is a bug to see)."""
    if not isinstance(exc, OSError) or exc.errno not in STORAGE_FULL_ERRNOS:
        return None
    where = exc.filename or f"under {os.fspath(output_dir)}"
    return (
        f"cannot write {where}: {_cause(exc)}; the records already written stay: make room, then run "
        "again with --resume"
    )
