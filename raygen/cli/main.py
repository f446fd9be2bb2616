"""The ``raygen`` command. It only turns flags into a RunConfig and calls the library (raygen.run.driver and
friends); anything worth testing lives there."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from raygen.cli import eval as eval_commands
from raygen.cli import export as export_commands
from raygen.cli import hygiene as hygiene_commands
from raygen.cli import verify as verify_commands
from raygen.cli.console import ConsoleReporter, print_counts, print_run_summary
from raygen.cli.options import (
    BestOf,
    ConfigSources,
    DatasetArg,
    FilterHallucinated,
    FilterIncomplete,
    FilterReasoning,
    FilterTruncated,
    FilterUnsafe,
    Groups,
    MinReward,
    Opt,
    OutputFormat,
    RunDirArg,
    Sets,
    ToolsetPlugins,
    flag_overrides,
    takes_flags,
)
from raygen.cli.run_flags import RunFlags
from raygen.cli.verify import verification_table
from raygen.config import RunConfig
from raygen.configfile import load_config
from raygen.errors import ClusterLost, ConfigError, InputError
from raygen.output.storage import StorageError
from raygen.output.writable import storage_failure
from raygen.run.drain import EXIT_RESUMABLE, StopNow

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Generate tool-using agent trajectories on Ray."
)
sim_app = typer.Typer(no_args_is_help=True, help="The built-in OpenAI-compatible simulator.")
app.add_typer(sim_app, name="sim")
out = Console(soft_wrap=True)  # a wrapped line splits paths and breaks grep on logs
err = Console(stderr=True, soft_wrap=True)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error[/]: {exc}", highlight=False, soft_wrap=True)
    if isinstance(exc, InputError):
        for problem in exc.problems:
            err.print(f"  {problem}", highlight=False, markup=False)
    raise typer.Exit(2)


@app.command()
@takes_flags(RunFlags)
def run(flags: RunFlags) -> None:
    """Validate DATASET, run every prompt as an agent session, and merge the results.

    Any config field without a flag: -c key.path=value (docs/configuration.md), e.g.
    -c sampling.temperature=0.7 -c session.system_prompt_file=system.txt -c model.type=scripted."""
    overrides = _run_overrides(flags)
    from raygen.run.driver import run as run_job

    logging.basicConfig(
        level=logging.INFO if flags.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        cfg = load_config(flags.config, overrides)
        if flags.dry_run:
            _print_resolved(cfg)
        result = run_job(
            cfg,
            resume=flags.resume,
            force=flags.force,
            dry_run=flags.dry_run,
            allow_unsafe_local=flags.allow_unsafe_local,
            reporter=ConsoleReporter(err),
            pilot=flags.pilot,
        )
    except (ConfigError, InputError) as exc:
        _fail(exc)
    except StopNow as exc:  # a second signal during a drain: what is durable stays, --resume goes on
        err.print(f"{exc}; resume with --resume", highlight=False)
        raise typer.Exit(EXIT_RESUMABLE) from None
    # The run's storage stayed unreachable, or its Ray head died mid-run: what is durable stays.
    except (StorageError, ClusterLost) as exc:
        err.print(Text.assemble(("error", "bold red"), f": {exc}; --resume continues once it is back"))
        raise typer.Exit(EXIT_RESUMABLE) from None
    except OSError as exc:  # the output disk filled up (or went read-only) mid-run: one line, not a traceback
        line = storage_failure(exc, cfg.output.output_dir)
        if line is None:
            raise
        err.print(Text.assemble(("error", "bold red"), f": {line}"), soft_wrap=True)
        raise typer.Exit(EXIT_RESUMABLE) from None
    if result.merge is not None:
        print_run_summary(result, err)
    if result.stop_reason:
        err.print(result.stop_reason, highlight=False, markup=False)
    if result.incomplete:
        raise typer.Exit(EXIT_RESUMABLE)


def _run_overrides(flags: RunFlags) -> dict[str, Any]:
    """The flags given, as the overrides ``load_config`` applies over the -c sources."""
    overrides = flag_overrides(RunFlags, vars(flags))
    if flags.base_url is not None:
        # An endpoint means the openai backend, even over a config file that chose another model type.
        overrides["model"]["type"] = "openai"
    overrides["dataset"] = str(flags.dataset)
    return overrides


def _print_resolved(cfg: RunConfig) -> None:
    import yaml

    err.print("resolved config:", highlight=False)
    err.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False, markup=False)


@app.command()
def validate(
    dataset: DatasetArg,
    as_json: Annotated[bool, Opt("--json", help="Print the report as JSON.")] = False,
    plugins: ToolsetPlugins = None,
    mcp_config: Annotated[
        list[str] | None, Opt("--mcp-config", help="MCP servers whose names rows may use as toolsets.")
    ] = None,
    eval_set: Annotated[
        Path | None, Opt("--eval-set", help="Also report prompts that occur in this evaluation set.")
    ] = None,
) -> None:
    """Check every line of DATASET (exit 1 with file:line: field: message for each problem), and report
    secrets, personal data and eval-set overlap found in the prompts (warnings, values masked)."""
    from raygen.cli.hygiene import print_hygiene, validate_hygiene
    from raygen.input.validate import scan_dataset
    from raygen.tools.mcp_config import configured_servers
    from raygen.tools.registry import load_registry

    try:
        registry = load_registry(plugins or [])
        servers = configured_servers({}, mcp_config or [])  # names only: no server is started here
        report = scan_dataset(dataset, known_toolsets=set(registry.toolset_names()) | set(servers))
        hygiene = validate_hygiene(dataset, eval_set, as_json=True, console=err) if report.ok else None
    except (ConfigError, InputError, OSError) as exc:
        _fail(exc)
    if as_json:
        body = report.to_dict()
        if hygiene is not None:
            body["hygiene"] = hygiene.to_dict()
        out.print_json(json.dumps(body))
    else:
        for line in report.summary_lines():
            out.print(line, highlight=False)
        for notice in report.notices:
            err.print(f"[yellow]warning[/]: {notice}", highlight=False)
        for problem in report.problems:
            err.print(f"[red]error[/]: {problem}", highlight=False)
        if hygiene is not None:
            print_hygiene(hygiene, err)
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def distributions(plugins: ToolsetPlugins = None) -> None:
    """List the built-in toolset distributions."""
    from raygen.tools.distributions import builtin_distributions
    from raygen.tools.registry import load_registry

    available = load_registry(plugins or []).toolset_names()
    table = Table("name", "toolsets (probability %)", "description")
    for name, dist in sorted(builtin_distributions().items()):
        probs = ", ".join(f"{k} {v:g}" for k, v in dist.probabilities(available).items())
        table.add_row(name, probs, dist.description)
    out.print(table)


@app.command()
def merge(
    run_dir: RunDirArg,
    filter_reasoning: FilterReasoning = None,
    filter_hallucinated: FilterHallucinated = None,
    filter_incomplete: FilterIncomplete = None,
    filter_unsafe: FilterUnsafe = None,
    filter_truncated: FilterTruncated = None,
    min_reward: MinReward = None,
    best_of: BestOf = None,
    groups: Groups = None,
    output_format: OutputFormat = None,
) -> None:
    """Re-run the filtered merge from the shards (no model calls), e.g. with other filters or
    --format hermes."""
    overrides = flag_overrides(merge, locals()).get("filters", {})
    from raygen.run.folder_commands import remerge

    try:
        result = remerge(run_dir, overrides, output_format=output_format)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    print_counts(result.stats, f"merged {run_dir}", err)
    if (rewards := verification_table(result.stats)) is not None:
        err.print(rewards)


@app.command()
def status(run_dir: RunDirArg) -> None:
    """Accounting of a run: total = kept + rejected + failed + pending."""
    from raygen.run.folder_commands import run_status

    try:
        st = run_status(run_dir)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    table = Table(title=f"status of {run_dir}", show_header=False)
    for label, value in st.rows():
        table.add_row(label, str(value))
    out.print(table)


@app.command()
def clean(run_dir: RunDirArg) -> None:
    """Remove containers and sandboxes a killed run left on this node."""
    from raygen.envs import environment_class
    from raygen.run.folder_commands import read_run_config

    try:
        config = read_run_config(run_dir)
        removed = environment_class(config.env.type).reap(config.env, config.output.run_name)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    out.print(f"removed {removed} container(s) of run {config.output.run_name}")


@sim_app.command("serve")
def sim_serve(
    config: ConfigSources = None,
    host: Annotated[str | None, Opt(help="Listen address [127.0.0.1]."), Sets("sim.host")] = None,
    port: Annotated[int | None, Opt(help="Port [8008]."), Sets("sim.port")] = 8008,
    latency: Annotated[
        float | None, Opt(help="Mean latency per request, seconds."), Sets("sim.latency_s")
    ] = None,
    rpm: Annotated[
        float | None, Opt(help="Hard request limit per minute (429 beyond)."), Sets("sim.rate_limit_rpm")
    ] = None,
    error_rate: Annotated[
        float | None, Opt(help="Share of requests answered 5xx."), Sets("sim.error_rate")
    ] = None,
    hallucinate_rate: Annotated[
        float | None, Opt(help="Share of sessions calling an unknown tool."), Sets("sim.hallucinate_rate")
    ] = None,
    no_reasoning_rate: Annotated[
        float | None, Opt(help="Share of sessions without reasoning."), Sets("sim.no_reasoning_rate")
    ] = None,
    log_path: Annotated[
        Path | None, Opt("--log", help="Append every request to this JSONL file."), Sets("sim.log_path")
    ] = None,
) -> None:
    """Serve the simulator until interrupted (settings: the `sim:` section of -c files, -c sim.key=value)."""
    overrides = flag_overrides(sim_serve, locals())
    import asyncio

    from raygen.sim.server import serve_forever

    try:
        cfg = load_config(config, overrides).sim
    except ConfigError as exc:
        _fail(exc)
    asyncio.run(serve_forever(cfg, lambda url: err.print(f"simulator listening on {url}")))


# The commands that live in their own module of this package (report/sample/compare, hygiene, rescore,
# export).
for _commands in (eval_commands, hygiene_commands, verify_commands, export_commands):
    _commands.register(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
