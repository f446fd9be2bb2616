"""Operations on a finished or interrupted run folder that need no model and no Ray: re-merge and status.
The folder itself (layout, storage, atomic writes) is ``raygen.output.run_dir.RunDir``.

``keys.txt`` (written by every run and resume) lists the sample keys of the dataset as it was last run,
so both work without the dataset file and agree with what the run itself counted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from raygen.config import FilterConfig, RunConfig
from raygen.configfile import run_config_from_manifest
from raygen.errors import RETRYABLE, UNCOUNTED
from raygen.output.hermes import hermes_options
from raygen.output.merge import MergeResult, choose_finals, merge_run
from raygen.output.run_dir import KEYS_FILE, MANIFEST_FILE, STATISTICS_FILE, RunDir
from raygen.output.run_lock import Holder, RunLock, lock_status
from raygen.output.shards import ShardScanStats

log = logging.getLogger(__name__)

STATS_FILTERS = "filters"
"""Key of ``statistics.json`` holding the filters of a ``raygen merge`` run with overrides."""


def write_keys(run_dir: RunDir | str | os.PathLike, keys: set[str]) -> None:
    RunDir.of(run_dir).write_keys(keys)


def read_run_config(run_dir: RunDir | str | os.PathLike) -> RunConfig:
    return run_config_from_manifest(RunDir.of(run_dir).read_manifest()["config"])


def remerge(
    run_dir: RunDir | str | os.PathLike,
    filter_overrides: dict[str, Any] | None = None,
    output_format: str | None = None,
) -> MergeResult:
    """The filtered merge again, from the shards, with the run's filters (or overrides) and output format
    (or ``output_format``: ``hermes`` writes ``trajectories.jsonl`` too, see raygen/output/hermes.py).

    The filters used are recorded in ``statistics.json`` so ``run_status`` classifies like this merge.
    It holds the run's lock (``RunLocked`` naming a driver, rescore or merge that holds it).
    """
    run_dir = RunDir.of(run_dir)
    config = read_run_config(run_dir)  # before the lock: a folder without a run is not created
    with holding(run_dir, "merge"):
        return merge_held(run_dir, config, filter_overrides, output_format)


@contextmanager
def holding(run_dir: RunDir, command: str) -> Iterator[RunLock]:
    """The run's ``driver.lock``, held by this ``raygen COMMAND`` until the block ends: a merge swaps the
    output folders and a rescore appends to the shards, neither under a driver still writing them."""
    with RunLock(run_dir, command=command).hold() as lock:
        if lock.taken_over is not None:
            log.info("%s: taking over from %s: gone", run_dir, lock.taken_over.describe())
        yield lock


def merge_held(
    run_dir: RunDir,
    config: RunConfig,
    filter_overrides: dict[str, Any] | None = None,
    output_format: str | None = None,
) -> MergeResult:
    """``remerge`` by a caller already ``holding`` the run."""
    filters = FilterConfig.model_validate({**config.filters.model_dump(), **(filter_overrides or {})})
    # What only the run itself knew (its work, the governor, the hygiene checks) survives a re-merge.
    previous = run_dir.read_json(STATISTICS_FILE) if run_dir.exists(STATISTICS_FILE) else {}
    result = merge_run(
        run_dir,
        filters,
        config.output.data_shard_records,
        expected_keys=run_dir.read_keys(),
        hermes=hermes_options(config, run_dir, output_format),
    )
    kept = {key: previous[key] for key in _RUN_ONLY_STATS if key in previous}
    if filter_overrides or kept:
        if filter_overrides:
            result.stats[STATS_FILTERS] = filters.model_dump()
        result.stats.update(kept)
        run_dir.write_json(STATISTICS_FILE, result.stats)
    return result


_RUN_ONLY_STATS = ("this_invocation", "hygiene")


def merged_filters(run_dir: RunDir, config: RunConfig) -> FilterConfig:
    """The filters of the latest merge: those ``raygen merge`` recorded, else the run's own."""
    try:
        recorded = run_dir.read_json(STATISTICS_FILE).get(STATS_FILTERS)
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
    spent_usd: float = 0.0
    """What every recorded attempt cost (docs/cost.md)."""
    driver: str | None = None
    """The driver holding the run (``driver.lock``), when there is one: running, or dead and stale."""
    unplanned: str | None = None
    """Set when a driver took the run but has not written its manifest and keys (nothing to count yet):
    whether it is still planning the run or was gone before it wrote the plan."""

    def rows(self) -> list[tuple[str, int | str]]:
        if self.unplanned:
            return [("state", self.unplanned), ("driver", self.driver or "?")]
        rows: list[tuple[str, int | str]] = [("total", self.total), ("kept", self.kept)]
        rows += [(f"rejected: {k}", v) for k, v in sorted(self.rejected.items())]
        rows += [(f"failed: {k}", v) for k, v in sorted(self.failed.items())]
        rows.append(("pending", self.pending))
        if self.spent_usd > 0:
            rows.append(("spent (USD, all attempts)", f"{self.spent_usd:.4f}"))
        if self.driver:
            rows.append(("driver", self.driver))
        return rows


def run_status(run_dir: RunDir | str | os.PathLike) -> RunStatus:
    """Count every sample key of ``keys.txt`` once: by the final record the merge would choose (with the
    latest merge's filters), or as pending when it has none or may still be retried."""
    run_dir = RunDir.of(run_dir)
    lock = lock_status(run_dir)
    if lock is not None and not (run_dir.exists(MANIFEST_FILE) and run_dir.exists(KEYS_FILE)):
        # The lock is taken before the plan is written: a status asked in between is not an error.
        state = "preparing: the driver is planning the run" if lock[1] else "not started: no plan written"
        return RunStatus(unplanned=state, driver=_driver_state(*lock))
    config = read_run_config(run_dir)
    keys = run_dir.read_keys()
    finals, counts = choose_finals(run_dir, merged_filters(run_dir, config), keys, ShardScanStats())
    st = RunStatus(total=len(keys), spent_usd=counts["spent_usd"])
    for final in finals.values():
        if final.outcome == "kept":
            st.kept += 1
        elif final.outcome == "rejected":
            st.rejected[final.reason or "?"] = st.rejected.get(final.reason or "?", 0) + 1
        elif final.reason in UNCOUNTED or (
            final.reason in RETRYABLE and final.rank[1] < config.retry.max_attempts
        ):
            st.pending += 1
        else:
            st.failed[final.reason or "?"] = st.failed.get(final.reason or "?", 0) + 1
    st.pending += len(keys) - len(finals)
    if lock is not None:
        st.driver = _driver_state(*lock)
    return st


def _driver_state(holder: Holder, running: bool) -> str:
    state = "running" if running else "gone (its lock is taken over by the next run)"
    return f"{state}: {holder.describe()}"
