"""CLI command ``raygen export`` (registered by raygen.cli; the work: raygen/export/)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from raygen.cli.eval import err, fail, out
from raygen.errors import ConfigError

Opt = typer.Option


def export(
    run_dir: Annotated[str, typer.Argument(help="A merged run folder (a path, or s3://... / gs://...).")],
    to: Annotated[str, Opt("--to", help="openai | trl | tokens | sharegpt | hermes")],
    out_dir: Annotated[str, Opt("--out", help="Folder of the export (a path, or s3://... / gs://...).")],
    tokenizer: Annotated[
        str | None,
        Opt(
            help="Hugging Face tokenizer (local folder or cached name) whose chat template renders the rows."
        ),
    ] = None,
    check: Annotated[
        bool, Opt("--check", help="Write template_check.json: render failures, token counts, server ids.")
    ] = False,
    max_length: Annotated[
        int | None, Opt("--max-length", min=1, help="Longest trajectory in tokens.")
    ] = None,
    over_length: Annotated[
        str,
        Opt("--over-length", help="A longer trajectory: drop it, or cut it after its last reply that fits."),
    ] = "drop",
    include: Annotated[
        str, Opt(help="Which final records: kept, rejected, failed (comma-separated).")
    ] = "kept",
    rows_per_shard: Annotated[int, Opt("--rows-per-shard", min=1, help="Rows per output file.")] = 10_000,
    token_rows: Annotated[
        str, Opt("--token-rows", help="tokens: one row per trajectory, or per model call (turn).")
    ] = "trajectory",
) -> None:
    """Write a finished run's records as training files: OpenAI fine-tuning JSONL, TRL messages + tools,
    token ids with loss masks and logprobs for RL, ShareGPT or Hermes. No model calls (docs/exports.md)."""
    from raygen.export.run import ExportOptions, export_run

    if over_length not in ("cut", "drop"):
        fail(ConfigError(f"--over-length {over_length!r}: choose cut or drop"))
    options = ExportOptions(
        fmt=to,
        out=out_dir,
        tokenizer=tokenizer,
        check=check,
        max_length=max_length,
        over_length=over_length,  # type: ignore[arg-type]  # checked above
        include=tuple(s.strip() for s in include.split(",") if s.strip()),
        rows_per_shard=rows_per_shard,
        token_rows=token_rows,  # type: ignore[arg-type]  # checked by the library
    )
    try:
        result = export_run(run_dir, options)
    except (ConfigError, OSError) as exc:
        fail(exc)
    _print_result(result)


def _print_result(result) -> None:  # an ExportResult
    summary = f"{result.rows:,} rows of {result.records:,} records -> {result.out} ({len(result.files)} files"
    summary += f", {result.cut:,} cut at --max-length)" if result.cut else ")"
    err.print(summary, highlight=False, markup=False, soft_wrap=True)
    if result.sources:
        sources = ", ".join(f"{n:,} {s}" for s, n in sorted(result.sources.items()))
        err.print(f"token ids: {sources}", highlight=False, markup=False)
    for reason, count in sorted(result.skipped.items()):
        err.print(f"skipped {count:,}: {reason}", highlight=False, markup=False, soft_wrap=True)
    if result.check is not None:
        out.print(check_table(result.check))


def check_table(check: dict) -> Table:
    """The template check in a few rows (the whole of it is template_check.json)."""
    table = Table(title=f"template check: {check['tokenizer']}", show_header=False)
    table.add_row("rendered", f"{check['rendered']:,} of {check['records']:,}")
    table.add_row("render failures", f"{check['render_failures']:,}")
    tokens = check["tokens"]
    table.add_row("tokens (min / median / max)", f"{tokens['min']} / {tokens['median']} / {tokens['max']}")
    if check["max_length"] is not None:
        table.add_row(f"over --max-length {check['max_length']}", f"{check['over_max_length']:,}")
    served = check["server_ids"]
    table.add_row("same tokens as the server", f"{served['matched']:,} of {served['compared']:,} compared")
    for example in check["render_failure_examples"][:3]:
        table.add_row(Text(f"failed: {example['id']}"), Text(example["error"]))
    for example in served["mismatch_examples"][:3]:
        where = "prompt" if example["in_prompt"] else "reply or tool result"
        detail = (
            f"token {example['position']} ({where}): {example['rendered']!r} vs served {example['served']!r}"
        )
        table.add_row(Text(f"differs: {example['id']}"), Text(detail))
    return table


def register(app: typer.Typer) -> None:
    """Add ``export`` to the ``raygen`` app."""
    app.command("export")(export)
