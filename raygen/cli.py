"""The ``raygen`` command. It only turns flags into a RunConfig and calls the library (raygen.runner and
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

from raygen.configfile import load_config, set_path
from raygen.errors import ConfigError, InputError

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Generate tool-using agent trajectories on Ray."
)
sim_app = typer.Typer(no_args_is_help=True, help="The built-in OpenAI-compatible simulator.")
app.add_typer(sim_app, name="sim")
out = Console()
err = Console(stderr=True)

Opt = typer.Option


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error[/]: {exc}", highlight=False)
    if isinstance(exc, InputError):
        for problem in exc.problems:
            err.print(f"  {problem}", highlight=False, markup=False)
    raise typer.Exit(2)


def _overrides(pairs: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for dotted, value in pairs.items():
        if value is not None:
            set_path(data, dotted, value)
    return data


@app.command()
def run(
    dataset: Annotated[Path, typer.Argument(help="Prompts JSONL.")],
    config: Annotated[Path | None, Opt("--config", "-c", help="YAML config; flags override it.")] = None,
    base_url: Annotated[
        str | None, Opt(help="OpenAI-compatible endpoint; unset: built-in simulator.")
    ] = None,
    model: Annotated[str | None, Opt(help="Model name.")] = None,
    api_key_env: Annotated[str | None, Opt(help="Variable holding the API key [OPENAI_API_KEY].")] = None,
    scripted: Annotated[bool, Opt(help="Use the in-process scripted model (no HTTP).")] = False,
    max_turns: Annotated[int | None, Opt(help="Most model calls per session [10].")] = None,
    max_tokens: Annotated[int | None, Opt(help="Completion token limit per call.")] = None,
    temperature: Annotated[float | None, Opt(help="Sampling temperature.")] = None,
    seed: Annotated[int | None, Opt(help="Sampling seed sent to the provider.")] = None,
    run_seed: Annotated[int | None, Opt(help="Seed of the per-prompt toolset draw [0].")] = None,
    extra_body: Annotated[str | None, Opt(help="JSON object merged into every request body.")] = None,
    system_prompt: Annotated[str | None, Opt(help="System prompt text.")] = None,
    system_prompt_file: Annotated[Path | None, Opt(help="File holding the system prompt.")] = None,
    distribution: Annotated[str | None, Opt(help="Toolset distribution name or YAML file [default].")] = None,
    env: Annotated[str | None, Opt("--env", help="Environment backend: local, fake, docker [local].")] = None,
    bwrap: Annotated[bool | None, Opt(help="Confine local sessions with bubblewrap.")] = None,
    workers: Annotated[int | None, Opt(help="Session actors [2].")] = None,
    sessions_per_worker: Annotated[int | None, Opt(help="Concurrent sessions per actor [16].")] = None,
    ray_address: Annotated[str | None, Opt(help="Join this Ray cluster instead of starting one.")] = None,
    rpm: Annotated[float | None, Opt(help="Cluster-wide requests per minute.")] = None,
    tpm: Annotated[float | None, Opt(help="Cluster-wide tokens per minute.")] = None,
    max_in_flight: Annotated[int | None, Opt(help="Cluster-wide requests in flight.")] = None,
    output_dir: Annotated[Path | None, Opt(help="Parent folder of runs [runs].")] = None,
    run_name: Annotated[str | None, Opt(help="Run folder name [dataset name + timestamp].")] = None,
    limit: Annotated[int | None, Opt(help="Only the first N valid rows.")] = None,
    max_attempts: Annotated[
        int | None, Opt(help="Attempts per sample on infrastructure failures [3].")
    ] = None,
    filter_reasoning: Annotated[bool | None, Opt("--filter-reasoning/--no-filter-reasoning")] = None,
    filter_hallucinated: Annotated[bool | None, Opt("--filter-hallucinated/--no-filter-hallucinated")] = None,
    filter_incomplete: Annotated[bool | None, Opt("--filter-incomplete/--no-filter-incomplete")] = None,
    filter_unsafe: Annotated[bool | None, Opt("--filter-unsafe/--no-filter-unsafe")] = None,
    resume: Annotated[bool, Opt(help="Continue the run folder: only pending samples run.")] = False,
    force: Annotated[bool, Opt(help="Resume even if the generation config changed.")] = False,
    dry_run: Annotated[bool, Opt(help="Validate and plan; run nothing.")] = False,
    allow_unsafe_local: Annotated[
        bool, Opt(help="Run needs_isolation rows on the bare local backend.")
    ] = False,
    verbose: Annotated[bool, Opt("--verbose", "-v")] = False,
) -> None:
    """Validate DATASET, run every prompt as an agent session, and merge the results."""
    from raygen.runner import run as run_job

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        extra = json.loads(extra_body) if extra_body else None
        if extra is not None and not isinstance(extra, dict):
            raise ConfigError("--extra-body must be a JSON object")
    except json.JSONDecodeError as exc:
        _fail(ConfigError(f"--extra-body is not valid JSON: {exc}"))
    overrides = _overrides(
        {
            "dataset": str(dataset),
            "model.type": "scripted" if scripted else None,
            "model.base_url": base_url,
            "model.model": model,
            "model.api_key_env": api_key_env,
            "session.max_turns": max_turns,
            "sampling.max_tokens": max_tokens,
            "sampling.temperature": temperature,
            "sampling.seed": seed,
            "sampling.extra_body": extra,
            "seed": run_seed,
            "session.system_prompt": system_prompt,
            "session.system_prompt_file": str(system_prompt_file) if system_prompt_file else None,
            "tools.distribution": distribution,
            "env.type": env,
            "env.bwrap": bwrap,
            "ray.workers": workers,
            "ray.sessions_per_worker": sessions_per_worker,
            "ray.address": ray_address,
            "governor.rpm": rpm,
            "governor.tpm": tpm,
            "governor.max_in_flight": max_in_flight,
            "output.output_dir": str(output_dir) if output_dir else None,
            "output.run_name": run_name,
            "limit": limit,
            "retry.max_attempts": max_attempts,
            "filters.no_reasoning": filter_reasoning,
            "filters.hallucinated_tools": filter_hallucinated,
            "filters.incomplete": filter_incomplete,
            "filters.unsafe_actions": filter_unsafe,
        }
    )
    try:
        cfg = load_config(config, overrides)
        if dry_run:
            import yaml

            err.print("resolved config:", highlight=False)
            err.print(
                yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), highlight=False, markup=False
            )
        result = run_job(
            cfg,
            resume=resume,
            force=force,
            dry_run=dry_run,
            allow_unsafe_local=allow_unsafe_local,
            console=err,
        )
    except (ConfigError, InputError) as exc:
        _fail(exc)
    if result.merge is not None:
        _print_summary(result)


def _print_summary(result: Any) -> None:
    stats = result.merge.stats
    table = Table(title=f"run {result.run_dir.name}", show_header=False)
    for label, value in _summary_rows(stats):
        table.add_row(label, str(value))
    err.print(table)
    tools = stats.get("tools", {})
    if tools:
        t = Table(title="tools (all sessions)")
        for col in ("tool", "calls", "success", "failure", "success rate"):
            t.add_column(col)
        for name, s in sorted(tools.items()):
            rate = s.get("success_rate")
            t.add_row(
                name,
                str(s["count"]),
                str(s["success"]),
                str(s["failure"]),
                "-" if rate is None else f"{rate:.1%}",
            )
        err.print(t)
    err.print(f'output: {result.run_dir}/data (load with datasets.load_dataset("{result.run_dir}/data"))')


def _summary_rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    counts = stats.get("counts", {})
    rows: list[tuple[str, Any]] = [("total", counts.get("total", 0)), ("kept", counts.get("kept", 0))]
    rows += [(f"rejected: {k}", v) for k, v in sorted(counts.get("rejected", {}).items())]
    rows += [(f"failed: {k}", v) for k, v in sorted(counts.get("failed", {}).items())]
    tokens = stats.get("tokens", {})
    rows.append(
        ("tokens (prompt / completion)", f"{tokens.get('prompt', 0)} / {tokens.get('completion', 0)}")
    )
    reasoning = stats.get("reasoning", {})
    if reasoning.get("coverage") is not None:
        rows.append(("reasoning coverage (turns)", f"{reasoning['coverage']:.1%}"))
    return rows


@app.command()
def validate(
    dataset: Annotated[Path, typer.Argument(help="Prompts JSONL.")],
    as_json: Annotated[bool, Opt("--json", help="Print the report as JSON.")] = False,
    plugins: Annotated[
        list[str] | None, Opt("--toolset-plugin", help="Extra toolsets (module:attr).")
    ] = None,
    eval_set: Annotated[
        Path | None, Opt("--eval-set", help="Also report prompts that occur in this evaluation set.")
    ] = None,
) -> None:
    """Check every line of DATASET (exit 1 with file:line: field: message for each problem), and report
    secrets, personal data and eval-set overlap found in the prompts (warnings, values masked)."""
    from raygen.hygiene.commands import print_hygiene, validate_hygiene
    from raygen.input.validate import scan_dataset
    from raygen.tools.registry import load_registry

    try:
        registry = load_registry(plugins or [])
        report = scan_dataset(dataset, known_toolsets=set(registry.toolset_names()))
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
def distributions(
    plugins: Annotated[
        list[str] | None, Opt("--toolset-plugin", help="Extra toolsets (module:attr).")
    ] = None,
) -> None:
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
    run_dir: Annotated[Path, typer.Argument(help="A run folder.")],
    filter_reasoning: Annotated[bool | None, Opt("--filter-reasoning/--no-filter-reasoning")] = None,
    filter_hallucinated: Annotated[bool | None, Opt("--filter-hallucinated/--no-filter-hallucinated")] = None,
    filter_incomplete: Annotated[bool | None, Opt("--filter-incomplete/--no-filter-incomplete")] = None,
    filter_unsafe: Annotated[bool | None, Opt("--filter-unsafe/--no-filter-unsafe")] = None,
) -> None:
    """Re-run the filtered merge from the shards (no model calls), e.g. with other filters."""
    from raygen.run_dir import remerge

    overrides = _overrides(
        {
            "no_reasoning": filter_reasoning,
            "hallucinated_tools": filter_hallucinated,
            "incomplete": filter_incomplete,
            "unsafe_actions": filter_unsafe,
        }
    )
    try:
        result = remerge(run_dir, overrides)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    table = Table(title=f"merged {run_dir}", show_header=False)
    for label, value in _summary_rows(result.stats):
        table.add_row(label, str(value))
    err.print(table)


@app.command()
def status(run_dir: Annotated[Path, typer.Argument(help="A run folder.")]) -> None:
    """Accounting of a run: total = kept + rejected + failed + pending."""
    from raygen.run_dir import run_status

    try:
        st = run_status(run_dir)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    table = Table(title=f"status of {run_dir}", show_header=False)
    for label, value in st.rows():
        table.add_row(label, str(value))
    out.print(table)


@app.command()
def clean(run_dir: Annotated[Path, typer.Argument(help="A run folder.")]) -> None:
    """Remove containers and sandboxes a killed run left on this node."""
    from raygen.envs.images import reap
    from raygen.run_dir import read_run_config

    try:
        config = read_run_config(run_dir)
        removed = reap(config.output.run_name, config.env)
    except (ConfigError, OSError) as exc:
        _fail(exc)
    out.print(f"removed {removed} container(s) of run {config.output.run_name}")


@sim_app.command("serve")
def sim_serve(
    config: Annotated[Path | None, Opt("--config", "-c", help="YAML with a `sim:` section.")] = None,
    host: Annotated[str | None, Opt(help="Listen address [127.0.0.1].")] = None,
    port: Annotated[int | None, Opt(help="Port [8008].")] = 8008,
    latency: Annotated[float | None, Opt(help="Mean latency per request, seconds.")] = None,
    rpm: Annotated[float | None, Opt(help="Hard request limit per minute (429 beyond).")] = None,
    error_rate: Annotated[float | None, Opt(help="Share of requests answered 5xx.")] = None,
    hallucinate_rate: Annotated[float | None, Opt(help="Share of sessions calling an unknown tool.")] = None,
    no_reasoning_rate: Annotated[float | None, Opt(help="Share of sessions without reasoning.")] = None,
    log_path: Annotated[Path | None, Opt("--log", help="Append every request to this JSONL file.")] = None,
) -> None:
    """Serve the simulator until interrupted."""
    import asyncio

    from raygen.sim.server import serve_forever

    overrides = _overrides(
        {
            "sim.host": host,
            "sim.port": port,
            "sim.latency_s": latency,
            "sim.rate_limit_rpm": rpm,
            "sim.error_rate": error_rate,
            "sim.hallucinate_rate": hallucinate_rate,
            "sim.no_reasoning_rate": no_reasoning_rate,
            "sim.log_path": str(log_path) if log_path else None,
        }
    )
    try:
        cfg = load_config(config, overrides).sim
    except ConfigError as exc:
        _fail(exc)
    asyncio.run(serve_forever(cfg, lambda url: err.print(f"simulator listening on {url}")))


def _register_extensions() -> None:
    """Commands that live with their feature (e.g. ``raygen.eval.commands``) register themselves here,
    so each feature's CLI stays next to its code and this module stays a thin router."""
    import importlib

    for module in _EXTENSIONS:
        try:
            importlib.import_module(module).register(app)
        except ModuleNotFoundError as exc:
            # Only "this extension is not there" is skipped; a missing dependency inside it is an error.
            if not (exc.name and (module == exc.name or module.startswith(exc.name + "."))):
                raise


_EXTENSIONS: list[str] = ["raygen.eval.commands", "raygen.hygiene.commands"]
_register_extensions()


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
