"""``raygen export``: read a merged run's final records, write one format, check the template.

No model calls and no Ray. Records stream from the merge's output (``data/`` by default: the kept ones);
each becomes one row or is skipped with a reason. With ``--tokenizer`` each conversation is also rendered
with the chat template, which gives the token counts for ``--max-length`` and, with ``--check``,
``template_check.json`` (check.py), also copied into the run folder for ``raygen report``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from raygen.errors import ConfigError
from raygen.export import formats
from raygen.export.check import TemplateCheck
from raygen.export.conversation import messages_of, tool_schemas
from raygen.export.render import NotPrefixConsistent, Rendering, render_record
from raygen.export.tokens import (
    NO_IDS,
    TokenRow,
    capture_gap,
    captured_row,
    captured_turn_rows,
    rendered_row,
    rendered_turn_rows,
)
from raygen.export.writer import EXPORT_FILE, TEMPLATE_CHECK_FILE, ShardWriter
from raygen.formats.chat_template import load_tokenizer
from raygen.output.run_dir import DATA_DIR, FAILED_DIR, MANIFEST_FILE, REJECTED_DIR, RunDir

SOURCES = {"kept": DATA_DIR, "rejected": REJECTED_DIR, "failed": FAILED_DIR}


@dataclass
class ExportOptions:
    fmt: str
    out: str
    tokenizer: str | None = None
    check: bool = False
    max_length: int | None = None
    over_length: Literal["cut", "drop"] = "drop"
    include: tuple[str, ...] = ("kept",)
    rows_per_shard: int = 10_000
    token_rows: Literal["trajectory", "turn"] = "trajectory"
    """``tokens``: one row per trajectory, or one per model call."""

    def validate(self) -> None:
        if self.fmt not in formats.FORMATS:
            raise ConfigError(f"--to {self.fmt!r}: choose one of {', '.join(formats.FORMATS)}")
        if self.token_rows not in ("trajectory", "turn"):
            raise ConfigError(f"--token-rows {self.token_rows!r}: choose trajectory or turn")
        if unknown := [s for s in self.include if s not in SOURCES]:
            raise ConfigError(f"--include {','.join(unknown)}: choose from {', '.join(SOURCES)}")
        if self.check and not self.tokenizer:
            raise ConfigError("--check renders with the chat template: give --tokenizer NAME_OR_PATH")
        if self.max_length is not None and not self.tokenizer and self.fmt != "tokens":
            raise ConfigError(
                "--max-length counts tokens: give --tokenizer NAME_OR_PATH (or export --to tokens)"
            )


@dataclass
class ExportResult:
    out: str
    rows: int = 0
    records: int = 0
    cut: int = 0
    skipped: Counter = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)
    check: dict[str, Any] | None = None
    sources: Counter = field(default_factory=Counter)
    """For ``tokens``: rows from the server's ids (``captured``) and from the template (``rendered``)."""


def iter_records(run_dir: RunDir, include: tuple[str, ...]):
    for source in include:
        for path in run_dir.output_files(SOURCES[source]):
            with run_dir.open_stream(path) as fh:
                for raw in fh:
                    if raw.strip():
                        record = json.loads(raw)
                        if isinstance(record, dict):
                            yield record


class _Exporter:
    def __init__(self, run_dir: RunDir, options: ExportOptions):
        self.options = options
        self.tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer else None
        self.check = TemplateCheck(options.tokenizer or "", options.max_length) if options.check else None
        self.writer = ShardWriter(options.out, options.fmt == "tokens", options.rows_per_shard)
        self.result = ExportResult(out=str(options.out))
        manifest = run_dir.read_json(MANIFEST_FILE) if run_dir.exists(MANIFEST_FILE) else {}
        self.hermes_tools = formats.hermes_tools(manifest) if options.fmt == "hermes" else []

    def render(self, record: dict[str, Any], record_id: str) -> Rendering | None:
        if self.tokenizer is None:
            return None
        try:
            rendering = render_record(self.tokenizer, messages_of(record), tool_schemas(record))
        except NotPrefixConsistent as exc:
            error = f"not prefix-consistent: {exc}"
        except Exception as exc:  # a template raises what it likes (jinja errors, raise_exception)
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            if self.check is not None:
                self.check.rendered_ok(record_id, rendering.ids)
            return rendering
        if self.check is not None:
            self.check.failed(record_id, error)
        return None

    def add(self, record: dict[str, Any]) -> None:
        self.result.records += 1
        record_id = str(record.get("id") or record.get("sample_key") or "")
        rendering = self.render(record, record_id)
        if self.check is not None:
            self._compare(record_id, record, rendering)
        if self.options.fmt == "tokens":
            for row in self._token_rows(record, rendering):
                self._add_tokens(record, row)
        else:
            self._add_messages(record, rendering)

    def _compare(self, record_id: str, record: dict[str, Any], rendering: Rendering | None) -> None:
        tools = tool_schemas(record)
        if rendering is not None:
            self.check.compare(record_id, record, self.tokenizer, tools, rendering)
            return
        try:  # rendered per turn: a template that failed on the whole may fail here too
            self.check.compare(record_id, record, self.tokenizer, tools, None)
        except Exception:  # the template's own error; render_failures counts the record
            return

    def _token_rows(self, record: dict[str, Any], rendering: Rendering | None) -> list[TokenRow]:
        """The record's rows: from the server's ids where they make them, else from the rendering; none
        (a skip, counted with its reason) when neither can."""
        per_turn = self.options.token_rows == "turn"
        rows = captured_turn_rows(record) if per_turn else captured_row(record)
        if rows is None and rendering is not None:
            rows = rendered_turn_rows(record, rendering) if per_turn else rendered_row(record, rendering)
        if rows is None:
            why = capture_gap(record, whole=not per_turn) or NO_IDS
            self._skip(why + (" and the template failed" if self.tokenizer else ", and no --tokenizer"))
            return []
        return rows if isinstance(rows, list) else [rows]

    def _skip(self, reason: str) -> None:
        self.result.skipped[reason] += 1

    def _add_tokens(self, record: dict[str, Any], row: TokenRow) -> None:
        cut = False
        limit = self.options.max_length
        if limit is not None and row.length > limit:
            if self.options.over_length == "drop" or (row := row.cut(limit)) is None:
                self._skip(f"over --max-length {limit}")
                return
            cut = True
        self.result.sources[row.source] += 1
        self._write(token_record(record, row, cut), cut)

    def _add_messages(self, record: dict[str, Any], rendering: Rendering | None) -> None:
        limit, cut_at = self.options.max_length, None
        if limit is not None:
            if rendering is None:
                self._skip("the chat template failed (no token count)")
                return
            if len(rendering.ids) > limit:
                fitting = [i for i, end in rendering.ends.items() if end <= limit and i >= rendering.first]
                if self.options.over_length == "drop" or not fitting:
                    self._skip(f"over --max-length {limit}")
                    return
                cut_at = max(fitting) + 1
        fmt = self.options.fmt
        if fmt == "hermes":
            row = formats.hermes_row(record, cut_at, self.hermes_tools)
        else:
            row = {"openai": formats.openai_row, "trl": formats.trl_row, "sharegpt": formats.sharegpt_row}[
                fmt
            ](record, cut_at)
        self._write(row, cut_at is not None)

    def _write(self, row: dict[str, Any], cut: bool) -> None:
        self.writer.add(row)
        self.result.rows += 1
        self.result.cut += int(cut)


def token_record(record: dict[str, Any], row: TokenRow, cut: bool) -> dict[str, Any]:
    status = str(record.get("exit_status") or "")
    return {
        "id": str(record.get("id") or record.get("sample_key") or ""),
        "sample_key": str(record.get("sample_key") or ""),
        "category": record.get("category"),
        "group_id": record.get("group_id"),
        "sample_index": int(record.get("sample_index") or 0),
        "reward": record.get("reward"),
        "exit_status": status,
        "is_truncated": cut or status in ("truncated", "max_turns"),
        "has_error": status.startswith("error:"),
        "cut": cut,
        "token_source": row.source,
        "turn": row.turn,
        "num_tokens": row.length,
        "prompt_ids": row.prompt_ids,
        "response_ids": row.response_ids,
        "loss_mask": row.loss_mask,
        "logprobs": row.logprobs,
    }


def export_run(run_dir: RunDir | str | os.PathLike, options: ExportOptions) -> ExportResult:
    """Export ``run_dir``'s records per ``options``; see the module docstring."""
    options.validate()
    run_dir = RunDir.of(run_dir)
    run_dir.require(MANIFEST_FILE)
    if not any(run_dir.output_files(SOURCES[s]) for s in options.include):
        raise ConfigError(f"{run_dir} has no merged records to export: run `raygen merge {run_dir}` first")
    exporter = _Exporter(run_dir, options)
    for record in iter_records(run_dir, options.include):
        exporter.add(record)
    exporter.writer.flush()
    result = exporter.result
    result.files = list(exporter.writer.files)
    if exporter.check is not None:
        result.check = exporter.check.summary()
        exporter.writer.write_json(TEMPLATE_CHECK_FILE, result.check)
        run_dir.write_json(TEMPLATE_CHECK_FILE, {**result.check, "export": str(options.out)})
    exporter.writer.write_json(EXPORT_FILE, _export_summary(run_dir, options, result))
    return result


def _export_summary(run_dir: RunDir, options: ExportOptions, result: ExportResult) -> dict[str, Any]:
    return {
        "run": str(run_dir),
        "format": options.fmt,
        "include": list(options.include),
        "tokenizer": options.tokenizer,
        "max_length": options.max_length,
        "over_length": options.over_length,
        "records": result.records,
        "rows": result.rows,
        "cut": result.cut,
        "skipped": dict(result.skipped),
        "token_sources": dict(result.sources),
        "token_rows": options.token_rows if options.fmt == "tokens" else None,
        "files": result.files,
    }
