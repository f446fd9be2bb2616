"""Operations on a finished or interrupted run folder that need no model and no Ray: re-merge and status.

``keys.txt`` (written by every run and resume) lists the sample keys of the dataset as it was last run,
so both work without the dataset file and agree with what the run itself counted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.config import FilterConfig, RunConfig
from raygen.errors import RETRYABLE, ConfigError
from raygen.output.manifest import write_json_atomic
from raygen.output.merge import STATISTICS_FILE, MergeResult, choose_finals, merge_run
from raygen.output.shards import ShardScanStats

KEYS_FILE = "keys.txt"
MANIFEST_FILE = "manifest.json"
STATS_FILTERS = "filters"
"""Key of ``statistics.json`` holding the filters of a ``raygen merge`` run with overrides."""


def write_keys(run_dir: Path, keys: set[str]) -> None:
    tmp = run_dir / (KEYS_FILE + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for key in sorted(keys):
            fh.write(key + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run_dir / KEYS_FILE)


def read_keys(run_dir: Path) -> set[str]:
    path = run_dir / KEYS_FILE
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a raygen run folder (no {KEYS_FILE})")
    return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}


def read_run_config(run_dir: Path) -> RunConfig:
    path = run_dir / MANIFEST_FILE
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a raygen run folder (no {MANIFEST_FILE})")
    return RunConfig.model_validate(json.loads(path.read_text(encoding="utf-8"))["config"])


def remerge(run_dir: Path, filter_overrides: dict[str, Any] | None = None) -> MergeResult:
    """The filtered merge again, from the shards, with the run's filters (or overrides).

    The filters used are recorded in ``statistics.json`` so ``run_status`` classifies like this merge.
    """
    config = read_run_config(run_dir)
    filters = FilterConfig.model_validate({**config.filters.model_dump(), **(filter_overrides or {})})
    stats_path = run_dir / STATISTICS_FILE
    # What only the run itself knew (its work, the governor, the hygiene checks) survives a re-merge.
    previous = json.loads(stats_path.read_text(encoding="utf-8")) if stats_path.exists() else {}
    result = merge_run(run_dir, filters, config.output.data_shard_records, expected_keys=read_keys(run_dir))
    kept = {key: previous[key] for key in _RUN_ONLY_STATS if key in previous}
    if filter_overrides or kept:
        if filter_overrides:
            result.stats[STATS_FILTERS] = filters.model_dump()
        result.stats.update(kept)
        write_json_atomic(stats_path, result.stats)
    return result


_RUN_ONLY_STATS = ("this_invocation", "hygiene")


def merged_filters(run_dir: Path, config: RunConfig) -> FilterConfig:
    """The filters of the latest merge: those ``raygen merge`` recorded, else the run's own."""
    try:
        recorded = json.loads((run_dir / STATISTICS_FILE).read_text(encoding="utf-8")).get(STATS_FILTERS)
    except (OSError, ValueError, AttributeError):
        recorded = None
    return FilterConfig.model_validate(recorded) if isinstance(recorded, dict) else config.filters


@dataclass
class RunStatus:
    total: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    """Final failures: not retryable, or out of attempts."""
    pending: int = 0
    """Never finished, or failed with a retryable kind and attempts left (``--resume`` runs them)."""

    def rows(self) -> list[tuple[str, int]]:
        rows = [("total", self.total), ("kept", self.kept)]
        rows += [(f"rejected: {k}", v) for k, v in sorted(self.rejected.items())]
        rows += [(f"failed: {k}", v) for k, v in sorted(self.failed.items())]
        rows.append(("pending", self.pending))
        return rows

    def accounted(self) -> int:
        return self.kept + sum(self.rejected.values()) + sum(self.failed.values()) + self.pending


def run_status(run_dir: Path) -> RunStatus:
    """Count every sample key of ``keys.txt`` once: by the final record the merge would choose (with the
    latest merge's filters), or as pending when it has none or may still be retried."""
    config = read_run_config(run_dir)
    keys = read_keys(run_dir)
    finals, _ = choose_finals(run_dir, merged_filters(run_dir, config), keys, ShardScanStats())
    st = RunStatus(total=len(keys))
    for final in finals.values():
        if final.outcome == "kept":
            st.kept += 1
        elif final.outcome == "rejected":
            st.rejected[final.reason or "?"] = st.rejected.get(final.reason or "?", 0) + 1
        elif final.reason in RETRYABLE and final.rank[1] < config.retry.max_attempts:
            st.pending += 1
        else:
            st.failed[final.reason or "?"] = st.failed.get(final.reason or "?", 0) + 1
    st.pending += len(keys) - len(finals)
    return st
