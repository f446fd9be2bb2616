"""Read a merged run folder: its manifest, its statistics and one streaming pass over its records.

The merge writes each final record once, under the folder of its outcome (``data/``, ``rejected/``,
``failed/``), so walking those folders visits every sample exactly once without the shards. Records
are yielded one at a time with their byte position, so a caller can keep positions (a few dozen bytes)
and re-read the few records it wants later instead of holding any record body.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raygen.errors import ConfigError, failure_kind
from raygen.formats.records import check_format_version
from raygen.output.filters import FAILED, KEPT, OUTCOMES, REJECTED
from raygen.output.run_dir import DATA_DIR, FAILED_DIR, MANIFEST_FILE, REJECTED_DIR, STATISTICS_FILE, RunDir
from raygen.output.shards import ShardPos
from raygen.output.stats import NO_CATEGORY

OUTCOME_DIRS = {KEPT: DATA_DIR, REJECTED: REJECTED_DIR, FAILED: FAILED_DIR}


@dataclass(frozen=True)
class RunInfo:
    """The two small documents of a run folder."""

    run_dir: RunDir
    manifest: dict[str, Any]
    statistics: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_name") or self.run_dir.name)


def _read_json(run_dir: RunDir, name: str) -> dict[str, Any]:
    try:
        body = run_dir.read_json(name)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {run_dir.describe(name)}: {exc}") from exc
    if not isinstance(body, dict):
        raise ConfigError(f"{run_dir.describe(name)} is not a JSON object")
    return body


def load_run(run_dir: RunDir | str | os.PathLike) -> RunInfo:
    """Manifest and statistics of a merged run; ``ConfigError`` with the fix when either is missing."""
    run_dir = RunDir.of(run_dir)
    run_dir.require(MANIFEST_FILE)
    if not run_dir.exists(STATISTICS_FILE):
        raise ConfigError(f"{run_dir} has no {STATISTICS_FILE} yet: run `raygen merge {run_dir}` first")
    return RunInfo(run_dir, _read_json(run_dir, MANIFEST_FILE), _read_json(run_dir, STATISTICS_FILE))


@dataclass(slots=True)
class RunRecord:
    """One final record with where it came from."""

    record: dict[str, Any]
    outcome: str
    reason: str | None
    """Rejection reason or failure kind; None for kept records."""
    pos: ShardPos
    line: int
    """1-based line number in ``pos.path``."""

    @property
    def category(self) -> str:
        category = self.record.get("category")
        return NO_CATEGORY if category is None else str(category)

    @property
    def key(self) -> str:
        """The sample key (falls back to the id, then the position, for hand-made files)."""
        return str(
            self.record.get("sample_key") or self.record.get("id") or f"{self.pos.path}:{self.pos.offset}"
        )


@dataclass
class ScanCounts:
    """What a pass saw, per outcome, and what it had to skip."""

    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    unparseable_lines: int = 0
    files: int = 0


def _reason(record: dict[str, Any], outcome: str) -> str | None:
    if outcome == REJECTED:
        return str(record.get("rejection_reason") or "unknown")
    if outcome == FAILED:
        return failure_kind(str(record.get("exit_status") or "")) or "unknown"
    return None


def iter_run_records(
    run_dir: RunDir | str | os.PathLike, outcomes: Iterable[str] = OUTCOMES, counts: ScanCounts | None = None
) -> Iterator[RunRecord]:
    """Every final record of the given outcomes, streamed; lines that are not JSON objects are counted
    in ``counts`` and skipped."""
    run_dir = RunDir.of(run_dir)
    counts = counts if counts is not None else ScanCounts()
    for outcome in outcomes:
        if outcome not in OUTCOME_DIRS:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        for path_str in run_dir.output_files(OUTCOME_DIRS[outcome]):
            counts.files += 1
            offset = 0
            with run_dir.open_stream(path_str) as fh:
                for number, raw in enumerate(fh, start=1):
                    line = raw.rstrip(b"\r\n")
                    pos = ShardPos(path_str, offset, len(line))
                    offset += len(raw)
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        record = None
                    if not isinstance(record, dict):
                        counts.unparseable_lines += 1
                        continue
                    check_format_version(record, f"{path_str}:{number}")
                    counts.records[outcome] += 1
                    yield RunRecord(record, outcome, _reason(record, outcome), pos, number)
