"""The driver's first phase: everything that can fail cheaply, checked before the run folder is touched
and before any model call (raygen.run.driver)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raygen.config import RunConfig
from raygen.envs import environment_class
from raygen.errors import ConfigError, InputError
from raygen.hygiene import HygieneReport
from raygen.input.validate import DatasetReport
from raygen.run.generation import Generation, RunSecrets
from raygen.run.plan import DatasetChecks, check_dataset
from raygen.run.reporter import RunReporter
from raygen.run.verify_prepare import prepare_dataset, task_findings

_PLACEMENT = {"session": "one per session", "actor": "one per actor", "remote": "by URL"}


@dataclass
class Preflight:
    """What the preflight found and built, before the run folder is touched."""

    dataset: Path
    """The prompts file (a Harbor tasks folder's, prepared)."""
    generation: Generation
    secrets: RunSecrets
    checks: DatasetChecks
    report: DatasetReport
    hygiene: HygieneReport


def preflight(config: RunConfig, reporter: RunReporter) -> Preflight:
    """Everything that can fail cheaply, before the run folder and any model call: the config's tools and
    MCP servers, the API key, the dataset (validation, hygiene: the first of its two reads)."""
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
    return Preflight(dataset, generation, secrets, checks, report, hygiene)


def _note_mcp_servers(generation: Generation, reporter: RunReporter) -> None:
    if generation.mcp_servers:
        listed = ", ".join(
            f"{s.name} ({s.listing.server_info}, {len(s.tool_names)} tools, {_PLACEMENT[s.config.placement]})"
            for s in generation.mcp_servers
        )
        reporter.note(f"MCP servers started and listed: {listed}")


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


def check_isolation(config: RunConfig, rows: int, allowed: bool) -> None:
    """Destructive prompts never run unconfined on the host with a real model."""
    real_model = config.model.type == "openai"
    unconfined = not environment_class(config.env.type).confines_destructive_rows(config.env)
    if rows and real_model and unconfined and not allowed:
        raise ConfigError(
            f"{rows} pending rows are marked needs_isolation, and the local backend without bwrap is not a "
            "sandbox: use --env docker (or modal, singularity), --bwrap, drop those rows, or pass "
            "--allow-unsafe-local if this machine is disposable"
        )
