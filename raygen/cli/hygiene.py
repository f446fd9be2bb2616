"""CLI command ``raygen hygiene`` (registered by raygen.cli), and the report printer that ``raygen run``
and ``raygen validate`` share."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from raygen.cli.options import ConfigSources
from raygen.config import HygieneConfig
from raygen.configfile import Source
from raygen.errors import ConfigError, InputError
from raygen.hygiene.scan import HygieneReport, scan_hygiene

Opt = typer.Option
out = Console(soft_wrap=True)  # a wrapped line splits paths and breaks grep on logs
err = Console(stderr=True, soft_wrap=True)


def print_hygiene(report: HygieneReport, console: Console, *, warn_label: str = "warning") -> None:
    """The summary, then one line per finding and overlap (values masked). Plain text: findings quote
    user data, which may hold [brackets] that rich would take for markup."""
    for line in report.summary_lines():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for item in [*report.findings, *report.overlaps]:
        console.print(Text.assemble((warn_label, "yellow"), f": {item}"), highlight=False, soft_wrap=True)


def validate_hygiene(
    dataset: Path, eval_set: Path | None, *, as_json: bool, console: Console
) -> HygieneReport:
    """The hygiene part of ``raygen validate``: scan with the default settings (and ``eval_set``); in text
    mode print the findings as warnings. In JSON mode print nothing: add ``report.to_dict()`` to the
    document under ``"hygiene"``."""
    report = scan_hygiene(dataset, HygieneConfig(eval_set=eval_set))
    if not as_json:
        print_hygiene(report, console)
    return report


def hygiene_config(
    config_file: Source | Sequence[Source] | None = None,
    *,
    eval_set: Path | None = None,
    eval_field: str | None = None,
    threshold: float | None = None,
    phone_region: str | None = None,
) -> tuple[HygieneConfig, list[str]]:
    """The ``hygiene`` section (and ``session.secret_env``) of a run config (files and ``-c`` overrides),
    with flags applied."""
    from raygen.configfile import load_config

    overrides = {
        k: v
        for k, v in {
            "eval_set": str(eval_set) if eval_set else None,
            "eval_field": eval_field,
            "near_duplicate_threshold": threshold,
            "phone_region": phone_region,
        }.items()
        if v is not None
    }
    cfg = load_config(config_file, {"hygiene": overrides} if overrides else None)
    return cfg.hygiene, list(cfg.session.secret_env)


def hygiene(
    dataset: Annotated[Path, typer.Argument(help="Prompts JSONL.")],
    eval_set: Annotated[
        Path | None, Opt("--eval-set", help="Independent evaluation set (JSONL): report prompts also in it.")
    ] = None,
    eval_field: Annotated[str | None, Opt(help="Field of the eval-set rows to compare [prompt].")] = None,
    threshold: Annotated[
        float | None, Opt("--near-duplicate-threshold", help="Similarity of a near duplicate [0.6].")
    ] = None,
    phone_region: Annotated[
        str | None, Opt(help="Region of phone numbers without a country code [US].")
    ] = None,
    config: ConfigSources = None,
    as_json: Annotated[bool, Opt("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Look for secrets, personal data and eval-set rows in DATASET (values shown masked); exit 1 if any."""
    try:
        cfg, secret_env = hygiene_config(
            config, eval_set=eval_set, eval_field=eval_field, threshold=threshold, phone_region=phone_region
        )
        report = scan_hygiene(dataset, cfg, secret_env=secret_env)
    except (ConfigError, InputError, OSError) as exc:
        err.print(Text.assemble(("error", "bold red"), f": {exc}"), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        print_hygiene(report, err)
    raise typer.Exit(1 if report.has_findings else 0)


def register(app: typer.Typer) -> None:
    """Add ``raygen hygiene`` to the CLI."""
    app.command("hygiene")(hygiene)
