"""The driver: validate, plan, run the sessions on Ray, merge. The CLI only builds a RunConfig and calls
``run``; tests and notebooks can do the same.

Order matters for money: everything that can fail cheaply (config, dataset, tools, safety, resume
fingerprint, images) is checked before the first model call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from raygen.config import RunConfig
from raygen.errors import ConfigError
from raygen.hygiene import HygieneReport, count_secret_leaks
from raygen.input.rows import Sample
from raygen.input.validate import DatasetReport
from raygen.model.pricing import ModelPricing
from raygen.output.digests import Compactor
from raygen.output.hermes import hermes_options
from raygen.output.manifest import build_manifest, utc_now
from raygen.output.merge import MergeResult, merge_run
from raygen.output.merge_parallel import MergeWorkers, merge_processes, workers_for
from raygen.output.run_dir import MANIFEST_FILE, SHARDS_DIR, STATISTICS_FILE, RunDir
from raygen.output.run_lock import RunLock
from raygen.output.writable import check_output_folder, check_run_name
from raygen.run.budget import BUDGET_DRAIN, check_pricing, reached_before_start, reached_line
from raygen.run.drain import Drain
from raygen.run.forecast import forecast, pilot_keys, pilot_lines
from raygen.run.generation import recorded_config, resume_check
from raygen.run.ledger import Ledger
from raygen.run.passes import run_passes
from raygen.run.plan import SamplePlan, plan_samples
from raygen.run.preflight import Preflight, check_isolation, preflight
from raygen.run.reporter import RunReporter
from raygen.run.services import run_services

log = logging.getLogger(__name__)


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
    """The run's phases in order: preflight, open the run folder, plan, then execute and merge."""
    checked = preflight(config, reporter)
    config, run_dir = _open_run_folder(
        config, checked, held, resume=resume, force=force, dry_run=dry_run, reporter=reporter
    )
    plan = _plan(
        config,
        checked,
        run_dir,
        held,
        resume=resume,
        pilot=pilot,
        allow_unsafe_local=allow_unsafe_local,
        reporter=reporter,
    )
    result = RunResult(
        run_dir=run_dir, report=checked.report, pending=plan.pending, dry_run=dry_run, hygiene=checked.hygiene
    )
    if dry_run:
        _forecast(config, checked, plan, reporter)
        return result
    manifest = _start_run_folder(config, run_dir, checked, plan.samples.expected, resumed=resume)
    workers = held.enter_context(_merge_workers(config, run_dir, len(plan.samples.expected)))
    compactor = None
    if workers is not None and config.output.compact_during_run:
        compactor = held.enter_context(Compactor(run_dir, workers.pool))  # stopped before the workers

    def merge(live: dict[str, Any]) -> None:
        if compactor is not None:
            compactor.stop()  # the merge digests what it left, on the same workers
        result.merge = _merge(config, checked, plan, run_dir, live, reporter, workers)

    with Drain(config.retry.drain_timeout_s) as drain:  # SIGTERM/SIGINT/SIGUSR1: finish, merge, exit 75
        _execute(config, checked, plan, run_dir, drain, result, reporter, merge)
        manifest["ended_at"] = utc_now()
        run_dir.write_json(MANIFEST_FILE, manifest)
    return result


@contextmanager
def _merge_workers(config: RunConfig, run_dir: RunDir, records: int) -> Iterator[MergeWorkers | None]:
    """The merge's worker processes, forked now, before Ray starts: the merge then runs before Ray's
    shutdown (1.5 s on one node) without forking a process Ray's threads share. None when the merge runs
    in one process (a small or object-store run, the Hermes export)."""
    hermes = hermes_options(config, run_dir)
    with workers_for(merge_processes(run_dir, hermes, config.output.merge_processes, records)) as workers:
        yield workers


def _open_run_folder(
    config: RunConfig,
    checked: Preflight,
    held: ExitStack,
    *,
    resume: bool,
    force: bool,
    dry_run: bool,
    reporter: RunReporter,
) -> tuple[RunConfig, RunDir]:
    """The run folder, checked (a new one empty; a resumed one of the same generation) and locked. Returns
    the config with its run name set."""
    if resume and not config.output.run_name:
        raise ConfigError("--resume needs --run-name (or output.run_name): the run folder to continue")
    run_name = config.output.run_name or default_run_name(checked.dataset)
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
        resume_check(run_dir.read_json(MANIFEST_FILE), checked.generation, force=force)
    elif not run_dir.is_empty():
        raise ConfigError(
            f"{run_dir} already exists; pass --resume to continue it, or choose another --run-name"
        )

    if not dry_run:  # one driver per run: taken before the ledger is read, held until the last write
        lock = held.enter_context(RunLock(run_dir).hold())
        if lock.taken_over is not None:
            reporter.note(f"{run_dir}: taking over from {lock.taken_over.describe()}: gone")
    return config, run_dir


@dataclass
class _Plan:
    """What the run has to do: the samples (every key, the pending ones spooled) and what they run on."""

    ledger: Ledger
    pricing: ModelPricing
    samples: SamplePlan
    chosen: set[str] | None = None
    """--pilot N: the pending samples it runs, spread over the categories (None: all of them)."""

    @property
    def pending(self) -> int:
        return self.samples.pending if self.chosen is None else len(self.chosen)

    def pending_samples(self) -> Iterator[Sample]:
        return self.samples.pending_samples(only=self.chosen)


def _plan(
    config: RunConfig,
    checked: Preflight,
    run_dir: RunDir,
    held: ExitStack,
    *,
    resume: bool,
    pilot: int | None,
    allow_unsafe_local: bool,
    reporter: RunReporter,
) -> _Plan:
    """The ledger of earlier attempts, the price, and the dataset's second read: which samples run."""
    ledger = Ledger.scan(run_dir) if resume else Ledger()
    pricing = check_pricing(config, reporter)  # a --max-cost without a price stops here
    if config.retry.retry_failed:
        _reopen_failures(config, ledger, resume, reporter)
    plan = _Plan(ledger, pricing, plan_samples(config, checked.dataset, checked.generation, ledger, held))
    expected, pending = plan.samples.expected, plan.samples.pending
    reporter.note(
        f"run {config.output.run_name}: {len(expected)} samples, {len(expected) - pending} already done, "
        f"{pending} to run"
    )
    if pilot is not None:
        pending_categories = ((s.sample_key, s.row.category) for s in plan.samples.pending_samples())
        plan.chosen = pilot_keys(pending_categories, pilot)
        reporter.note(f"pilot: running {plan.pending} of them")
    check_isolation(config, plan.samples.isolation_rows, allow_unsafe_local)
    return plan


def _forecast(config: RunConfig, checked: Preflight, plan: _Plan, reporter: RunReporter) -> None:
    """A dry run's last words: what the pending samples would cost, and the most model calls they make."""
    todo = plan.pending_samples()
    for line in forecast(todo, config, checked.generation.registry, plan.pricing).lines(plan.pricing, config):
        reporter.note(line)
    pending, max_turns = plan.pending, config.session.max_turns
    reporter.note(
        f"dry run: at most {pending * max_turns} model calls "
        f"({pending} sessions x max_turns {max_turns}); nothing was run"
    )


def _start_run_folder(
    config: RunConfig, run_dir: RunDir, checked: Preflight, expected: set[str], *, resumed: bool
) -> dict[str, Any]:
    """The run folder created, with its manifest (not ended yet) and every sample key. Returns the
    manifest."""
    run_dir.create()
    report = checked.report
    manifest = build_manifest(
        run_name=config.output.run_name,
        dataset={"path": str(checked.dataset.resolve()), "sha256": report.sha256, "rows": report.rows},
        config=recorded_config(config),
        model=checked.generation.model_name,
        base_url=getattr(config.model, "base_url", None),
        config_fingerprint=checked.generation.fingerprint,
        generation=checked.generation.settings,
        started_at=utc_now(),
        ended_at=None,
        resumed=resumed,
    )
    run_dir.write_json(MANIFEST_FILE, manifest)
    run_dir.write_keys(expected)
    return manifest


def _execute(
    config: RunConfig,
    checked: Preflight,
    plan: _Plan,
    run_dir: RunDir,
    drain: Drain,
    result: RunResult,
    reporter: RunReporter,
    merge: Callable[[dict[str, Any]], None],
) -> None:
    """The pending samples run on Ray (the services started, and stopped however this ends), then
    ``merge`` with what only the live run knows: before Ray's shutdown, so the data is out sooner. Sets
    the result's sessions run and whether the run is incomplete."""
    ledger, pending = plan.ledger, plan.pending
    if pending and (spent_line := reached_before_start(config, ledger)) is not None:
        result.incomplete, result.stop_reason = True, spent_line
    elif pending:
        spent = (ledger.spent_usd, ledger.spent_tokens)
        with run_services(config, checked.generation, checked.secrets, reporter, spent) as services:
            drain.install()  # over the SIGTERM handler ray.init set
            result.sessions_run, live = run_passes(
                services, plan.pending_samples(), pending, run_dir, ledger, drain
            )
            _note_incomplete(config, plan, drain, result, live, reporter)
            merge(live)
        return
    merge({})


def _note_incomplete(
    config: RunConfig,
    plan: _Plan,
    drain: Drain,
    result: RunResult,
    live: dict[str, Any],
    reporter: RunReporter,
) -> None:
    """Whether a drain (a signal or the budget) left samples for ``--resume``, and why."""
    left = _samples_left(config, plan)
    result.incomplete = drain.requested and left > 0
    if result.incomplete and drain.signal_name == BUDGET_DRAIN:
        result.stop_reason = reached_line(live["budget"])
    elif result.incomplete:
        reporter.note(
            f"{drain.signal_name}: stopped after the sessions in flight; {left} samples left for --resume"
        )


def _samples_left(config: RunConfig, plan: _Plan) -> int:
    """Samples with an attempt still to run (none run yet, or retryable failures)."""
    max_attempts = config.retry.max_attempts
    return sum(plan.ledger.next_attempt(key, max_attempts) is not None for key in plan.samples.expected)


def _merge(
    config: RunConfig,
    checked: Preflight,
    plan: _Plan,
    run_dir: RunDir,
    live: dict[str, Any],
    reporter: RunReporter,
    workers: MergeWorkers | None,
) -> MergeResult:
    """The filtered merge of every shard, the leak count, and statistics.json."""
    merge = merge_run(
        run_dir,
        config.filters,
        config.output.data_shard_records,
        expected_keys=plan.samples.expected,
        hermes=hermes_options(config, run_dir),
        processes=config.output.merge_processes,
        workers=workers,
    )
    leaks = _leak_check(checked.secrets.values, checked.checks.row_secrets, run_dir, reporter)
    merge.stats["hygiene"] = {**checked.hygiene.statistics(), **leaks}
    if plan.chosen is not None and live:
        slots = config.ray.workers * config.ray.sessions_per_worker
        for line in pilot_lines(live["per_session"], _samples_left(config, plan), slots):
            reporter.note(line)
    if live:
        # statistics.json describes the dataset (final records); these describe this invocation's work.
        merge.stats["this_invocation"] = live
    run_dir.write_json(STATISTICS_FILE, merge.stats)
    return merge


def _reopen_failures(config: RunConfig, ledger: Ledger, resume: bool, reporter: RunReporter) -> None:
    """``--retry-failed KIND[,KIND]``: final failures of those kinds run again (see ``Ledger.reopen``)."""
    kinds = config.retry.retry_failed
    if not resume:
        raise ConfigError("--retry-failed re-runs failures of an earlier run: it needs --resume")
    reopened = ledger.reopen(kinds, config.retry.max_attempts)
    reporter.note(f"--retry-failed {','.join(kinds)}: {reopened} failed samples run again")


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
