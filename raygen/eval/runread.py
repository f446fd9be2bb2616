"""Read a merged run folder: its manifest, its statistics and one streaming pass over its records.

The merge writes each final record once, under the folder of its outcome (``data/``, ``rejected/``,
``failed/``), so walking those folders visits every sample exactly once without the shards. Records
are yielded one at a time with their byte position, so a caller can keep positions (a few dozen bytes)
and re-read the few records it wants later instead of holding any record body.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.errors import ConfigError, failure_kind
from raygen.output.filters import FAILED, KEPT, OUTCOMES, REJECTED
from raygen.output.shards import ShardPos
from raygen.output.stats import NO_CATEGORY

MANIFEST_FILE = "manifest.json"
STATISTICS_FILE = "statistics.json"  # written by raygen.output.merge (not imported: it pulls in pyarrow)
OUTCOME_GLOBS = {KEPT: "data/*.jsonl", REJECTED: "rejected/*.jsonl", FAILED: "failed/*.jsonl"}


@dataclass(frozen=True)
class RunInfo:
    """The two small documents of a run folder."""

    run_dir: Path
    manifest: dict[str, Any]
    statistics: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_name") or self.run_dir.name)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(body, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return body


def load_run(run_dir: str | Path) -> RunInfo:
    """Manifest and statistics of a merged run; ``ConfigError`` with the fix when either is missing."""
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a raygen run folder (no {MANIFEST_FILE})")
    if not (run_dir / STATISTICS_FILE).is_file():
        raise ConfigError(f"{run_dir} has no {STATISTICS_FILE} yet: run `raygen merge {run_dir}` first")
    return RunInfo(run_dir, _read_json(run_dir / MANIFEST_FILE), _read_json(run_dir / STATISTICS_FILE))


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


def outcome_files(run_dir: Path, outcome: str) -> list[Path]:
    """The JSONL files of one outcome folder, in name order (the merge's write order)."""
    return sorted(run_dir.glob(OUTCOME_GLOBS[outcome]))


def _reason(record: dict[str, Any], outcome: str) -> str | None:
    if outcome == REJECTED:
        return str(record.get("rejection_reason") or "unknown")
    if outcome == FAILED:
        return failure_kind(str(record.get("exit_status") or "")) or "unknown"
    return None


def iter_run_records(
    run_dir: str | Path, outcomes: Iterable[str] = OUTCOMES, counts: ScanCounts | None = None
) -> Iterator[RunRecord]:
    """Every final record of the given outcomes, streamed; lines that are not JSON objects are counted
    in ``counts`` and skipped."""
    run_dir = Path(run_dir)
    counts = counts if counts is not None else ScanCounts()
    for outcome in outcomes:
        if outcome not in OUTCOME_GLOBS:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        for path in outcome_files(run_dir, outcome):
            counts.files += 1
            path_str = str(path)
            offset = 0
            with open(path, "rb") as fh:
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
                    counts.records[outcome] += 1
                    yield RunRecord(record, outcome, _reason(record, outcome), pos, number)
