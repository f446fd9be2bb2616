"""The driver: validate, plan, run the sessions on Ray, merge. The CLI only builds a RunConfig and calls
``run``; tests and notebooks can do the same.

Order matters for money: everything that can fail cheaply (config, dataset, tools, safety, resume
fingerprint, images) is checked before the first model call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from raygen.config import RunConfig
from raygen.envs import environment_class
from raygen.errors import ConfigError, InputError
from raygen.hygiene import HygieneReport, count_secret_leaks
from raygen.input.rows import Sample
from raygen.input.validate import DatasetReport
from raygen.output.hermes import hermes_options
from raygen.output.manifest import build_manifest, utc_now
from raygen.output.merge import MergeResult, merge_run
from raygen.output.run_dir import MANIFEST_FILE, SHARDS_DIR, STATISTICS_FILE, RunDir
from raygen.output.run_lock import RunLock
from raygen.output.summary import summarize
from raygen.output.writable import check_output_folder, check_run_name
from raygen.run.budget import BUDGET_DRAIN, check_pricing, reached_before_start, reached_line
from raygen.run.drain import Drain
from raygen.run.forecast import forecast, pilot_keys, pilot_lines
from raygen.run.generation import Generation, RunSecrets, recorded_config, resume_check
from raygen.run.ledger import Ledger, worker_lost_record
from raygen.run.plan import check_dataset, plan_samples
from raygen.run.reporter import RunReporter
from raygen.run.services import RunServices, run_services
from raygen.run.sink import ResultSink
from raygen.run.verify_prepare import prepare_dataset, task_findings

log = logging.getLogger(__name__)

_PLACEMENT = {"session": "one per session", "actor": "one per actor", "remote": "by URL"}

_LOST = "no result came back: the worker running it died and Ray's task retries were exhausted"


@dataclass
class RunResult:
    run_dir: RunDir
    report: DatasetReport
    sessions_run: int = 0
    merge: MergeResult | None = None
    dry_run: bool = False
    pending: int = 0
    hygiene: HygieneReport | None = None
    incomplete: bool = False
    """A signal or the budget drained the run before every sample ran: ``--resume`` finishes it (exit 75)."""
    stop_reason: str | None = None
    """Why the run stopped early, in one line (``budget reached: $X of $Y; ...``)."""


def default_run_name(dataset: Path) -> str:
    return f"{dataset.stem}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def run(
    config: RunConfig,
    *,
    resume: bool = False,
    force: bool = False,
    dry_run: bool = False,
    allow_unsafe_local: bool = False,
    reporter: RunReporter | None = None,
    pilot: int | None = None,
) -> RunResult:
    """Run ``config`` (see the module docstring). What the run has to say goes to ``reporter``: the CLI
    renders it; the default writes it to the ``raygen`` logger."""
    with ExitStack() as held:  # what the run holds until it returns, however it ends (the run lock)
        return _run(
            config,
            held,
            resume=resume,
            force=force,
            dry_run=dry_run,
            allow_unsafe_local=allow_unsafe_local,
            reporter=reporter or RunReporter(),
            pilot=pilot,
        )


def _run(
    config: RunConfig,
    held: ExitStack,
    *,
    resume: bool,
    force: bool,
    dry_run: bool,
    allow_unsafe_local: bool,
    reporter: RunReporter,
    pilot: int | None = None,
) -> RunResult:
    if config.dataset is None:
        raise ConfigError("no dataset given")
    dataset = Path(config.dataset)
    generation = Generation.build(config)  # MCP servers: each started once here, its tools listed
    secrets = RunSecrets.from_environment(config)  # a missing API key stops the run before anything else
    _note_mcp_servers(generation, reporter)
    dataset = prepare_dataset(config, dataset, reporter)  # a Harbor tasks folder becomes a prompts file

    checks = check_dataset(config, dataset, known_toolsets=set(generation.registry.toolset_names()))
    report = task_findings(checks.report, Path(config.dataset))  # Harbor: name the task, not the cached file
    reporter.dataset_checked(report)
    report.raise_if_invalid()
    hygiene = _report_hygiene(config, dataset, checks.hygiene, reporter)

    if resume and not config.output.run_name:
        raise ConfigError("--resume needs --run-name (or output.run_name): the run folder to continue")
    run_name = config.output.run_name or default_run_name(dataset)
    check_run_name(run_name)  # one folder name: "../x" or "/abs" would write outside --output-dir
    config = config.model_copy(update={"output": config.output.model_copy(update={"run_name": run_name})})
    run_dir = RunDir.under(config.output.output_dir, run_name, config.output.storage_retry_s)
    run_dir.check()
    if run_dir.is_local:  # a file, read-only or full: one line now, not a traceback after the sessions
        check_output_folder(run_dir.local_path)
    has_manifest = run_dir.exists(MANIFEST_FILE)
    if resume and not has_manifest and not run_dir.exists(SHARDS_DIR):
        # Killed before its manifest was written: nothing was recorded, so resuming is starting.
        reporter.note(f"--resume: {run_dir} holds no run yet; starting it")
    elif resume:
        if not has_manifest:
            raise ConfigError(f"--resume: {run_dir} has no {MANIFEST_FILE}; nothing to resume")
        resume_check(run_dir.read_json(MANIFEST_FILE), generation, force=force)
    elif not run_dir.is_empty():
        raise ConfigError(
            f"{run_dir} already exists; pass --resume to continue it, or choose another --run-name"
        )

    if not dry_run:  # one driver per run: taken before the ledger is read, held until the last write
        lock = held.enter_context(RunLock(run_dir).hold())
        if lock.taken_over is not None:
            reporter.note(f"{run_dir}: taking over from {lock.taken_over.describe()}: gone")
    ledger = Ledger.scan(run_dir) if resume else Ledger()
    pricing = check_pricing(config, reporter)  # a --max-cost without a price stops here
    max_attempts = config.retry.max_attempts
    if config.retry.retry_failed:
        _reopen_failures(config, ledger, resume, reporter)
    plan = plan_samples(config, dataset, generation, ledger, held)
    expected, pending = plan.expected, plan.pending
    reporter.note(
        f"run {run_name}: {len(expected)} samples, {len(expected) - pending} already done, {pending} to run"
    )
    chosen = None  # --pilot N: the pending samples it runs, spread over the categories
    if pilot is not None:
        chosen = pilot_keys(((s.sample_key, s.row.category) for s in plan.pending_samples()), pilot)
        pending = len(chosen)
        reporter.note(f"pilot: running {pending} of them")
    result = RunResult(run_dir=run_dir, report=report, pending=pending, dry_run=dry_run, hygiene=hygiene)
    _check_isolation(config, plan.isolation_rows, allow_unsafe_local)
    if dry_run:
        todo = plan.pending_samples(only=chosen)
        for line in forecast(todo, config, generation.registry, pricing).lines(pricing, config):
            reporter.note(line)
        reporter.note(
            f"dry run: at most {pending * config.session.max_turns} model calls "
            f"({pending} sessions x max_turns {config.session.max_turns}); nothing was run"
        )
        return result

    run_dir.create()
    started = utc_now()
    manifest = build_manifest(
        run_name=run_name,
        dataset={"path": str(dataset.resolve()), "sha256": report.sha256, "rows": report.rows},
        config=recorded_config(config),
        model=generation.model_name,
        base_url=getattr(config.model, "base_url", None),
        config_fingerprint=generation.fingerprint,
        generation=generation.settings,
        started_at=started,
        ended_at=None,
        resumed=resume,
    )
    run_dir.write_json(MANIFEST_FILE, manifest)
    run_dir.write_keys(expected)

    live: dict[str, Any] = {}
    with Drain(config.retry.drain_timeout_s) as drain:  # SIGTERM/SIGINT/SIGUSR1: finish, merge, exit 75
        if pending and (spent_line := reached_before_start(config, ledger)) is not None:
            result.incomplete, result.stop_reason = True, spent_line
        elif pending:
            samples = plan.pending_samples(only=chosen)
            spent = (ledger.spent_usd, ledger.spent_tokens)
            with run_services(config, generation, secrets, reporter, spent) as services:
                drain.install()  # over the SIGTERM handler ray.init set
                result.sessions_run, live = _run_passes(services, samples, pending, run_dir, ledger, drain)
            left = sum(ledger.next_attempt(key, max_attempts) is not None for key in expected)
            result.incomplete = drain.requested and left > 0
            if result.incomplete and drain.signal_name == BUDGET_DRAIN:
                result.stop_reason = reached_line(live["budget"])
            elif result.incomplete:
                reporter.note(
                    f"{drain.signal_name}: stopped after the sessions in flight; {left} samples left for "
                    "--resume"
                )

        merge = merge_run(
            run_dir,
            config.filters,
            config.output.data_shard_records,
            expected_keys=expected,
            hermes=hermes_options(config, run_dir),
        )
        leaks = _leak_check(secrets.values, checks.row_secrets, run_dir, reporter)
        merge.stats["hygiene"] = {**hygiene.statistics(), **leaks}
        if chosen is not None and live:
            slots = config.ray.workers * config.ray.sessions_per_worker
            left = sum(ledger.next_attempt(key, max_attempts) is not None for key in expected)
            for line in pilot_lines(live["per_session"], left, slots):
                reporter.note(line)
        if live:
            # statistics.json describes the dataset (final records); these describe this invocation's work.
            merge.stats["this_invocation"] = live
        run_dir.write_json(STATISTICS_FILE, merge.stats)
        result.merge = merge
        manifest["ended_at"] = utc_now()
        run_dir.write_json(MANIFEST_FILE, manifest)
    return result


def _note_mcp_servers(generation: Generation, reporter: RunReporter) -> None:
    if generation.mcp_servers:
        listed = ", ".join(
            f"{s.name} ({s.listing.server_info}, {len(s.tool_names)} tools, {_PLACEMENT[s.config.placement]})"
            for s in generation.mcp_servers
        )
        reporter.note(f"MCP servers started and listed: {listed}")


def _reopen_failures(config: RunConfig, ledger: Ledger, resume: bool, reporter: RunReporter) -> None:
    """``--retry-failed KIND[,KIND]``: final failures of those kinds run again (see ``Ledger.reopen``)."""
    kinds = config.retry.retry_failed
    if not resume:
        raise ConfigError("--retry-failed re-runs failures of an earlier run: it needs --resume")
    reopened = ledger.reopen(kinds, config.retry.max_attempts)
    reporter.note(f"--retry-failed {','.join(kinds)}: {reopened} failed samples run again")


def _report_hygiene(
    config: RunConfig, dataset: Path, report: HygieneReport, reporter: RunReporter
) -> HygieneReport:
    """Secrets, personal data and eval-set rows in the prompts that will run, before any model call:
    reported (values masked) as warnings, or refused with ``hygiene.on_findings: refuse``."""
    refuse = report.has_findings and config.hygiene.on_findings == "refuse"
    reporter.hygiene_checked(report, refused=refuse)
    if refuse:
        raise InputError(
            f"{dataset}: the prompts hold secrets, personal data or eval-set rows and hygiene.on_findings "
            "is refuse; nothing was run (values are masked below)",
            [*report.findings, *report.overlaps],
        )
    return report


def _leak_check(
    run_secrets: Iterable[str], row_secrets: set[str], run_dir: RunDir, reporter: RunReporter
) -> dict[str, Any]:
    """Count secret values (API key, values of ``session.secret_env`` variables) in the run's output."""
    leaks = count_secret_leaks(run_dir, set(run_secrets) | row_secrets)
    if leaks["secret_leaks"]:
        reporter.warning(
            f"{leaks['secret_leaks']} occurrence(s) of secret values in the output "
            f"({leaks['secret_leaks_by_folder']}); see statistics.json hygiene"
        )
    return leaks


def _check_isolation(config: RunConfig, rows: int, allowed: bool) -> None:
    """Destructive prompts never run unconfined on the host with a real model."""
    real_model = config.model.type == "openai"
    unconfined = not environment_class(config.env.type).confines_destructive_rows(config.env)
    if rows and real_model and unconfined and not allowed:
        raise ConfigError(
            f"{rows} pending rows are marked needs_isolation, and the local backend without bwrap is not a "
            "sandbox: use --env docker (or modal, singularity), --bwrap, drop those rows, or pass "
            "--allow-unsafe-local if this machine is disposable"
        )


def _run_passes(
    services: RunServices,
    samples: Iterator[Sample],
    pending: int,
    run_dir: RunDir,
    ledger: Ledger,
    drain: Drain,
) -> tuple[int, dict[str, Any]]:
    """Run ``samples`` (the ``pending`` ones, as their next attempt) in passes until nothing is
    pending or ``drain`` is requested. Returns the number of sessions run and what only the live run knows
    (statistics of every attempt, the governor's history)."""
    from raygen.distributed.pipeline import chunk_rows_for, write_pending

    config = services.config
    work = run_dir.work_dir()  # on the driver's local disk, whatever storage holds the run
    sink = ResultSink(
        run_dir,
        ledger,
        config,
        services.reporter,
        services.monitor.line,
        on_budget_reached=lambda: drain.request(BUDGET_DRAIN),
        spent_before_usd=ledger.spent_usd,
    )
    try:
        for pass_no in range(1, config.retry.max_attempts + 1):
            if drain.requested:
                break
            # One chunk is one Ray task (a task re-run after its actor died skips the sessions that had
            # finished: control.py). Pass 1's size is known, so its chunks shrink towards its end
            # (pipeline.chunk_rows_for); a retry pass's is not (and small).
            files, count = write_pending(
                samples,
                work,
                (lambda written: chunk_rows_for(pending - written, config.ray))
                if pass_no == 1
                else config.ray.sessions_per_worker,
                alone=ledger.lost_worker_before,
                name=f"pass{pass_no}",
            )
            if not count:
                break
            if pass_no > 1:
                services.reporter.note(
                    f"pass {pass_no}: retrying {count} samples after infrastructure failures"
                )
                time.sleep(config.retry.pass_delay_s * 2 ** (pass_no - 2))  # backoff: 1x, 2x, 4x ...
            _run_pass(services, sink, files, count, drain)
            # The next pass is planned from this one's files: only their samples can still be pending.
            samples = ledger.still_pending(files, config.retry.max_attempts)
    finally:
        sink.close()
        for leftover in work.glob("*.jsonl"):
            leftover.unlink()
    live = sink.live_statistics()
    if (governor := services.monitor.report()) is not None:
        live["governor"] = governor
    if (budget := services.budget_report()) is not None:
        live["budget"] = budget
    return sink.sessions, live


def _run_pass(services: RunServices, sink: ResultSink, files: list[Path], count: int, drain: Drain) -> None:
    """One pass over the samples in ``files``: each finished session into the sink, then each sample
    that never came back recorded as a retryable ``error:worker_lost`` (unless a drain stopped the pass:
    those samples simply stay pending)."""
    from raygen.distributed.pipeline import run_pipeline

    with sink.progress(count):
        run_pipeline(services.plan, files, sink.add, tick=sink.tick, drain=drain, rows=count)
        lost_samples = () if drain.requested else sink.ledger.undelivered(files)
        for lost in lost_samples:  # Ray gave up on their worker
            generation = services.generation
            record = worker_lost_record(
                lost, model=generation.model_name, config_fingerprint=generation.fingerprint, detail=_LOST
            )
            sink.add(record.model_dump_json(), summarize(record))
    sink.flush()
