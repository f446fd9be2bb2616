"""The driver: validate, plan, run the sessions on Ray, merge. The CLI only builds a RunConfig and calls
``run``; tests and notebooks can do the same.

Order matters for money: everything that can fail cheaply (config, dataset, tools, safety, resume
fingerprint, images) is checked before the first model call.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console

from raygen.config import RunConfig
from raygen.errors import ConfigError, InputError
from raygen.generation import GenerationSetup, resume_check
from raygen.hygiene import (
    HygieneReport,
    count_secret_leaks,
    host_secret_values,
    row_secret_values,
    scan_hygiene,
)
from raygen.input.rows import Sample
from raygen.input.validate import DatasetReport, iter_samples, scan_dataset
from raygen.ledger import Ledger, worker_lost_record
from raygen.output.filters import classify
from raygen.output.manifest import build_manifest, utc_now, write_json_atomic
from raygen.output.merge import MergeResult, merge_run
from raygen.output.shards import ShardWriter
from raygen.output.stats import StatsAccumulator
from raygen.output.summary import SessionSummary, summarize
from raygen.progress import RunProgress
from raygen.run_dir import write_keys

log = logging.getLogger(__name__)

_LOST = "no result came back: the worker running it died and Ray's task retries were exhausted"


@dataclass
class RunResult:
    run_dir: Path
    report: DatasetReport
    sessions_run: int = 0
    merge: MergeResult | None = None
    dry_run: bool = False
    pending: int = 0
    notes: list[str] = field(default_factory=list)
    hygiene: HygieneReport | None = None


def default_run_name(dataset: Path) -> str:
    return f"{dataset.stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def run(
    config: RunConfig,
    *,
    resume: bool = False,
    force: bool = False,
    dry_run: bool = False,
    allow_unsafe_local: bool = False,
    console: Console | None = None,
) -> RunResult:
    console = console or Console(stderr=True)
    if config.dataset is None:
        raise ConfigError("no dataset given")
    dataset = Path(config.dataset)
    setup = GenerationSetup.build(config)

    report = scan_dataset(dataset, known_toolsets=set(setup.registry.toolset_names()))
    for line in report.summary_lines():
        console.print(line, highlight=False)
    for notice in report.notices:
        console.print(f"[yellow]warning[/]: {notice}")
    report.raise_if_invalid()
    hygiene = _check_hygiene(config, dataset, console)
    setup.secret_values.extend(host_secret_values(config.session.secret_env))

    if resume and not config.output.run_name:
        raise ConfigError("--resume needs --run-name (or output.run_name): the run folder to continue")
    run_name = config.output.run_name or default_run_name(dataset)
    config = config.model_copy(update={"output": config.output.model_copy(update={"run_name": run_name})})
    run_dir = Path(config.output.output_dir) / run_name
    manifest_path = run_dir / "manifest.json"
    if resume and not manifest_path.exists() and not (run_dir / "shards").exists():
        # Killed before its manifest was written: nothing was recorded, so resuming is starting.
        console.print(f"--resume: {run_dir} holds no run yet; starting it", highlight=False)
    elif resume:
        if not manifest_path.exists():
            raise ConfigError(f"--resume: {run_dir} has no manifest.json; nothing to resume")
        resume_check(manifest_path, setup, force=force)
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"{run_dir} already exists; pass --resume to continue it, or choose another --run-name"
        )

    ledger = Ledger.scan(run_dir) if resume else Ledger()
    max_attempts = config.retry.max_attempts
    expected, pending, isolation_rows = _plan_samples(config, dataset, setup, ledger, max_attempts)
    result = RunResult(run_dir=run_dir, report=report, pending=pending, dry_run=dry_run, hygiene=hygiene)
    _check_isolation(config, isolation_rows, allow_unsafe_local)
    console.print(
        f"run {run_name}: {len(expected)} samples, {len(expected) - pending} already done, {pending} to run",
        highlight=False,
    )
    if dry_run:
        console.print(
            f"dry run: at most {pending * config.session.max_turns} model calls "
            f"({pending} sessions x max_turns {config.session.max_turns}); nothing was run",
            highlight=False,
        )
        return result

    run_dir.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    manifest = build_manifest(
        run_name=run_name,
        dataset={"path": str(dataset.resolve()), "sha256": report.sha256, "rows": report.rows},
        config=config.model_dump(mode="json"),
        model=setup.model_name,
        base_url=config.model.base_url if config.model.type == "openai" else None,
        config_fingerprint=setup.fingerprint,
        generation=setup.generation,
        started_at=started,
        ended_at=None,
        resumed=resume,
    )
    write_json_atomic(manifest_path, manifest)
    write_keys(run_dir, expected)

    live: dict[str, Any] = {}
    if pending:
        result.sessions_run = _execute(config, setup, dataset, run_dir, ledger, pending, console, live)

    merge = merge_run(run_dir, config.filters, config.output.data_shard_records, expected_keys=expected)
    merge.stats["hygiene"] = {**hygiene.statistics(), **_leak_check(config, dataset, setup, run_dir, console)}
    if live:
        # statistics.json describes the dataset (final records); these describe this invocation's work.
        merge.stats["this_invocation"] = live
    write_json_atomic(run_dir / "statistics.json", merge.stats)
    result.merge = merge
    manifest["ended_at"] = utc_now()
    write_json_atomic(manifest_path, manifest)
    return result


def _plan_samples(
    config: RunConfig, dataset: Path, setup: GenerationSetup, ledger: Ledger, max_attempts: int
) -> tuple[set[str], int, int]:
    """One streaming pass: every sample key of the dataset, how many are pending, and how many rows
    need an isolated environment."""
    expected: set[str] = set()
    pending = isolation = 0
    for sample in _samples(config, dataset, setup):
        expected.add(sample.sample_key)
        if ledger.next_attempt(sample.sample_key, max_attempts) is not None:
            pending += 1
            if sample.row.metadata.get("needs_isolation") is True:
                isolation += 1
    return expected, pending, isolation


def _samples(config: RunConfig, dataset: Path, setup: GenerationSetup) -> Iterator[Sample]:
    return iter_samples(dataset, run_seed=config.seed, distribution=setup.distribution, limit=config.limit)


def _check_hygiene(config: RunConfig, dataset: Path, console: Console) -> HygieneReport:
    """Secrets, personal data and eval-set rows in the prompts that will run, before any model call:
    printed (values masked) as warnings, or refused with ``hygiene.on_findings: refuse``."""
    from raygen.hygiene.commands import print_hygiene

    report = scan_hygiene(dataset, config.hygiene, limit=config.limit, secret_env=config.session.secret_env)
    refuse = report.has_findings and config.hygiene.on_findings == "refuse"
    if report.has_findings and not refuse:
        print_hygiene(report, console)
    else:
        for line in report.summary_lines():
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    if refuse:
        raise InputError(
            f"{dataset}: the prompts hold secrets, personal data or eval-set rows and hygiene.on_findings "
            "is refuse; nothing was run (values are masked below)",
            [*report.findings, *report.overlaps],
        )
    return report


def _leak_check(
    config: RunConfig, dataset: Path, setup: GenerationSetup, run_dir: Path, console: Console
) -> dict[str, Any]:
    """Count secret values (API key, values of ``session.secret_env`` variables) in the run's output."""
    values = set(setup.secret_values) | row_secret_values(dataset, config.session.secret_env, config.limit)
    leaks = count_secret_leaks(run_dir, values)
    if leaks["secret_leaks"]:
        console.print(
            f"[bold red]warning[/]: {leaks['secret_leaks']} occurrence(s) of secret values in the output "
            f"({leaks['secret_leaks_by_folder']}); see statistics.json hygiene",
            highlight=False,
        )
    return leaks


def _check_isolation(config: RunConfig, rows: int, allowed: bool) -> None:
    """Destructive prompts never run unconfined on the host with a real model."""
    real_model = config.model.type == "openai" and config.model.base_url is not None
    unconfined = config.env.type == "local" and not getattr(config.env, "bwrap", False)
    if rows and real_model and unconfined and not allowed:
        raise ConfigError(
            f"{rows} pending rows are marked needs_isolation, and the local backend without bwrap is not a "
            "sandbox: use --env docker (or modal, singularity), --bwrap, drop those rows, or pass "
            "--allow-unsafe-local if this machine is disposable"
        )


def _execute(
    config: RunConfig,
    setup: GenerationSetup,
    dataset: Path,
    run_dir: Path,
    ledger: Ledger,
    pending: int,
    console: Console,
    live: dict[str, Any],
) -> int:
    """Run passes until nothing is pending; returns the number of sessions run. ``live`` receives what
    only the live run knows (statistics of every attempt, the governor's history)."""
    from raygen.distributed.cluster import ensure_ray, shutdown_ray
    from raygen.distributed.governor import get_or_create_governor
    from raygen.distributed.monitor import GovernorMonitor
    from raygen.distributed.pipeline import run_pipeline, write_pending
    from raygen.distributed.plan import WorkerPlan

    sim = None
    base_url = config.model.base_url if config.model.type == "openai" else None
    if config.model.type == "openai" and base_url is None:
        from raygen.sim.server import start_subprocess

        sim = start_subprocess(config.sim)
        base_url = sim.url
        console.print(f"no --base-url: using the built-in simulator at {base_url} (no API key needed)")
    started_ray = False
    writer = ShardWriter(
        run_dir,
        f"driver-{uuid.uuid4().hex[:12]}",
        config.output.shard_max_records,
        config.output.shard_flush_s,
    )
    ran = 0
    attempts = StatsAccumulator()  # every attempt of this invocation, from the summaries Ray delivers
    monitor = None
    _reap(config, console)  # containers a killed earlier attempt of this run left behind
    try:
        started_ray = ensure_ray(config.ray.address)
        # Created by the driver so it lives exactly as long as the run (named: workers find it).
        monitor = GovernorMonitor(
            get_or_create_governor(config.governor, base_url, config.model.model, setup.api_key)
        )
        plan = WorkerPlan(
            config=config,
            run_name=str(config.output.run_name),
            base_url=base_url,
            api_key=SecretStr(setup.api_key),
            config_fingerprint=setup.fingerprint,
            secret_values=[SecretStr(v) for v in setup.secret_values],
        )
        for pass_no in range(1, config.retry.max_attempts + 1):
            samples = (
                s.model_copy(update={"attempt": attempt})
                for s in _samples(config, dataset, setup)
                if (attempt := ledger.next_attempt(s.sample_key, config.retry.max_attempts)) is not None
            )
            # One chunk is one Ray task, whose results reach the driver only when it ends: a chunk of one
            # actor's worth of sessions keeps actors full yet bounds what a crash loses (docs/resume.md).
            chunk = config.ray.sessions_per_worker
            files, count = write_pending(samples, run_dir / "work", chunk, alone=ledger.lost_worker_before)
            if not count:
                break
            if pass_no > 1:
                console.print(f"pass {pass_no}: retrying {count} samples after infrastructure failures")
                time.sleep(config.retry.pass_delay_s * 2 ** (pass_no - 2))  # backoff: 1x, 2x, 4x ...
            with RunProgress(count, console) as progress:
                kept = rejected = 0

                def on_result(record_json: str, summary: SessionSummary) -> None:
                    nonlocal kept, rejected
                    writer.add(record_json)
                    ledger.record(summary.sample_key, summary.attempt, summary.exit_status)
                    outcome, reason = classify(summary, config.filters)
                    kept += outcome == "kept"
                    rejected += outcome == "rejected"
                    progress.extra = f"kept {kept} rejected {rejected}" + (
                        f" | {gov}" if (gov := monitor.line()) else ""
                    )
                    attempts.add(summary, outcome, reason)
                    progress.update(summary.exit_status)

                run_pipeline(plan, files, on_result)
                for lost in ledger.undelivered(files):  # Ray gave up on their worker: a retryable failure
                    record = worker_lost_record(
                        lost, model=setup.model_name, config_fingerprint=setup.fingerprint, detail=_LOST
                    )
                    on_result(record.model_dump_json(), summarize(record))
                ran += progress.done
            writer.flush()
        live["attempts"] = attempts.to_dict()
        if monitor is not None and (governor := monitor.report()) is not None:
            live["governor"] = governor
    finally:
        writer.close()
        for leftover in (run_dir / "work").glob("pending-*.jsonl"):
            leftover.unlink()
        if started_ray:
            shutdown_ray()
        if sim is not None:
            sim.stop()
        _reap(config, console)
    return ran


def _reap(config: RunConfig, console: Console) -> None:
    """Remove this run's leftover containers on this node (no-op for backends without containers)."""
    if config.env.type not in ("docker", "singularity"):
        return
    from raygen.envs.images import reap

    removed = reap(str(config.output.run_name), config.env)
    if removed:
        console.print(f"removed {removed} leftover container(s) of run {config.output.run_name}")


def summary_rows(result: RunResult) -> list[tuple[str, Any]]:
    if result.merge is None:
        return []
    counts = result.merge.stats.get("counts", {})
    rows: list[tuple[str, Any]] = [("total", counts.get("total")), ("kept", counts.get("kept"))]
    rows += [(f"rejected: {k}", v) for k, v in sorted(counts.get("rejected", {}).items())]
    rows += [(f"failed: {k}", v) for k, v in sorted(counts.get("failed", {}).items())]
    return rows
