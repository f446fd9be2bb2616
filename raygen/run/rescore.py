"""``raygen rescore RUN_DIR``: grade the stored artifacts again, with no model call, then re-merge.

For after a flaky test or a verifier bug was fixed in the dataset. Every final record that was verified
(``verification`` set: graded, or failed with ``verify_error``) is graded again with the CURRENT check of
its row (the dataset named in the manifest, or ``--dataset``), in a fresh environment that receives the
artifacts stored with the record, then the hidden files. A record graded in ``same`` mode is regraded in
a fresh one too: its artifacts are all that is left of the agent's environment.

Each regraded record is appended to the run's shards as a new line of the same attempt, counting its
regrade in ``verification.rescored`` (the merge takes the latest regrade of an attempt, whatever the
files' dates), so the original lines stay as they were; a check that still cannot run is written as
``verify_error`` and loses to an earlier graded line (a non-failed record outranks a failed one).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.envs import EnvSpec, create_environment
from raygen.formats.records import Artifact, Trajectory
from raygen.input.validate import iter_samples
from raygen.input.verify_spec import VerifySpec
from raygen.output.merge import MergeResult, choose_finals
from raygen.output.run_dir import RunDir
from raygen.output.shards import RecordReader, ShardScanStats, ShardWriter
from raygen.run.folder_commands import holding, merge_held, read_run_config
from raygen.verify.grader import VerifyError, grade

log = logging.getLogger(__name__)


@dataclass
class RescoreResult:
    regraded: int = 0
    changed: int = 0
    """Records whose reward (or error) differs from before."""
    errors: int = 0
    """Checks that still could not run."""
    skipped: int = 0
    """Verified records whose row is no longer in the dataset or has no check."""
    damaged: int = 0
    """Final records that could not be read back as a record (left as they are, and counted)."""
    merge: MergeResult | None = None
    changes: list[tuple[str, Any, Any]] = field(default_factory=list)
    """``(sample_key, old reward, new reward)`` of the changed records (None: no reward)."""


class _NoDraw:
    def draw(self, run_seed: int, sample_key: str) -> list[str]:
        return []


def _checks(dataset: Path, samples_per_prompt: int, default: VerifySpec | None) -> Iterator[tuple[str, Any]]:
    for sample in iter_samples(
        dataset, run_seed=0, distribution=_NoDraw(), samples_per_prompt=samples_per_prompt
    ):
        yield sample.sample_key, (sample.row, sample.row.verify or default)


def rescore(
    run_dir: RunDir | str | Path, *, dataset: str | Path | None = None, concurrency: int = 4
) -> RescoreResult:
    """Regrade the verified records of a run folder and re-merge it (see the module docstring), holding
    the run's lock throughout (``RunLocked`` while a driver, merge or rescore holds it)."""
    run = RunDir.of(run_dir)
    config = read_run_config(run)  # before the lock: a folder without a run is not created
    with holding(run, "rescore"):
        return _rescore_held(run, config, dataset, concurrency)


def _rescore_held(run: RunDir, config: Any, dataset: str | Path | None, concurrency: int) -> RescoreResult:
    source = Path(dataset or config.dataset or "")
    if source.is_dir():  # a Harbor tasks folder, read as the run read it
        from raygen.verify.harbor import tasks_to_jsonl

        source, _ = tasks_to_jsonl(source, config.env.type)
    checks = dict(_checks(source, config.samples_per_prompt, config.verify.default))
    finals, _ = choose_finals(run, config.filters, run.read_keys(), ShardScanStats())
    result = RescoreResult()
    records = []
    with RecordReader() as reader:
        for final in finals.values():
            try:
                record = Trajectory.model_validate_json(reader.read_line(final.pos))
            except ValueError as exc:  # one damaged line is that record's problem, never the command's
                result.damaged += 1
                log.warning("%s: record %s cannot be read back, left as it is: %s", run, final.key, exc)
                continue
            if record.verification is not None:
                records.append(record)
    writer = ShardWriter(run, f"rescore-{uuid.uuid4().hex[:12]}", 10_000, 3600.0)
    try:
        regraded = asyncio.run(
            _regrade_all(records, checks, config, str(config.output.run_name), concurrency)
        )
        for old, new in zip(records, regraded, strict=True):
            if new is None:
                result.skipped += 1
                continue
            result.regraded += 1
            result.errors += new.exit_status == "error:verify_error"
            if (old.reward, old.exit_status) != (new.reward, new.exit_status):
                result.changed += 1
                result.changes.append((old.sample_key, old.reward, new.reward))
            writer.add(new.model_dump_json())
    finally:
        writer.close()
    result.merge = merge_held(run, config)
    return result


async def _regrade_all(
    records: list[Trajectory], checks: dict[str, Any], config: Any, run_name: str, concurrency: int
) -> list[Trajectory | None]:
    slots = asyncio.Semaphore(concurrency)

    async def one(record: Trajectory) -> Trajectory | None:
        row, spec = checks.get(record.sample_key, (None, None))
        if spec is None:
            return None
        async with slots:
            return await regrade(record, row, spec, config.env, run_name)

    return await asyncio.gather(*(one(r) for r in records))


async def regrade(
    record: Trajectory, row: Any, spec: VerifySpec, env_config: Any, run_name: str
) -> Trajectory:
    """``record`` with the reward and verification of ``spec`` run on its stored artifacts."""
    env_spec = EnvSpec(
        session_key=f"{record.sample_key}-a{record.attempt}-rescore",
        run_name=run_name,
        image=row.image,
        cwd=row.cwd,
        env=dict(row.env),
    )
    stored = {a.path: a for a in record.artifacts}
    artifacts: list[Artifact] = [stored[p] for p in spec.artifacts if p in stored]
    missing = [p for p in spec.artifacts if p not in stored]
    session_status = record.verification.session_status if record.verification else ""
    session_status = session_status or "completed"
    # Which regrade this is, in the record itself: the merge prefers the latest (not the newest file).
    rescored = (record.verification.rescored if record.verification else 0) + 1
    fresh = spec.model_copy(update={"mode": "fresh"})
    for attempt in range(spec.retries + 1):
        try:
            graded = await grade(
                fresh,
                agent_env=None,
                open_fresh=lambda: create_environment(env_config, env_spec),
                artifacts=artifacts,
                missing=missing,
                messages=record.messages,
            )
            break
        except VerifyError as exc:
            if attempt < spec.retries:
                continue
            exc.verification.session_status = session_status
            exc.verification.rescored = rescored
            update = {"reward": None, "verification": exc.verification, "exit_status": "error:verify_error"}
            update.update(completed=False, error=f"verify_error: {exc}")
            return record.model_copy(update=update)
    graded.verification.session_status = session_status
    graded.verification.rescored = rescored
    update = {"reward": graded.reward, "verification": graded.verification, "exit_status": session_status}
    update.update(completed=session_status == "completed", error=None)
    return record.model_copy(update=update)
