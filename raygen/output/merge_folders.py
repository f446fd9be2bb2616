"""Where a merge builds its output folders, and how they replace the previous merge's
(raygen.output.merge).

The outputs are built in ``RUN_DIR/.merge-<token>/`` and each folder is then swapped in (old renamed away,
new renamed in, old deleted). A crash leaves each folder either old or new; the next merge restores or
deletes the leftovers (``recover_leftovers``). On an object store (no rename) they are built in a local
temp folder and uploaded file by file, each file one atomic put.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from raygen.output.hermes import HermesWriter
from raygen.output.run_dir import OUTPUT_DIRS, STATISTICS_FILE, TRAJECTORIES_FILE, RunDir
from raygen.output.storage import TMP_SUFFIX, fsync_dir

logger = logging.getLogger(__name__)

_TMP_PREFIX = ".merge-"
_OLD_PREFIX = ".merge-old-"


def recover_leftovers(run_dir: Path) -> None:
    """Undo what a crashed merge left: restore a folder that was renamed away, drop temp folders."""
    for entry in sorted(run_dir.glob(_OLD_PREFIX + "*")):
        name = entry.name.rsplit("-", 1)[-1]
        if name in OUTPUT_DIRS and not (run_dir / name).exists():
            os.replace(entry, run_dir / name)
        else:
            shutil.rmtree(entry, ignore_errors=True)
    for entry in run_dir.glob(_TMP_PREFIX + "*"):
        if entry.is_dir() and not entry.name.startswith(_OLD_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)
    for torn in run_dir.glob(f"{STATISTICS_FILE}*{TMP_SUFFIX}"):  # a write killed before its rename
        torn.unlink(missing_ok=True)
    (run_dir / (TRAJECTORIES_FILE + TMP_SUFFIX)).unlink(missing_ok=True)


def _swap_in(run_dir: Path, built: Path, token: str) -> None:
    olds = []
    for name in OUTPUT_DIRS:
        final, old = run_dir / name, run_dir / f"{_OLD_PREFIX}{token}-{name}"
        if final.exists():
            os.replace(final, old)
            olds.append(old)
        os.replace(built / name, final)
        fsync_dir(run_dir)
    for old in olds:
        shutil.rmtree(old)
    built.rmdir()


def build_folder(run: RunDir, token: str) -> Path:
    """An empty folder per output folder, built on the run's own filesystem (swapped in by renames), or
    locally for an object store (uploaded)."""
    built = run.local_path / f"{_TMP_PREFIX}{token}" if run.is_local else Path(tempfile.mkdtemp(_TMP_PREFIX))
    for name in OUTPUT_DIRS:
        (built / name).mkdir(parents=True)
    return built


def publish(run: RunDir, built: Path, token: str) -> None:
    """The built output folders replace the run's: swapped in by renames, or uploaded file by file."""
    if run.is_local:
        for name in OUTPUT_DIRS:
            fsync_dir(built / name)
        _swap_in(run.local_path, built, token)
    else:
        for name in OUTPUT_DIRS:
            run.publish(built / name, name)


def abandon(run: RunDir, built: Path, hermes_writer: HermesWriter | None) -> None:
    """A merge that failed leaves the previous output as it was."""
    shutil.rmtree(built, ignore_errors=True)
    if hermes_writer is not None:
        hermes_writer.abandon()
    if run.is_local:
        try:  # a failed swap may have renamed an old folder away: put it back
            recover_leftovers(run.local_path)
        except OSError:
            logger.exception("could not restore the previous output of %s", run)
