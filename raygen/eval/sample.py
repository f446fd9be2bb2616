"""``raygen sample``: a seeded review sample, stratified by category (and outcome), as JSONL + Markdown.

Strata are (category, outcome). Kept sessions are always sampled; ``include=("rejected", "failed")``
adds those outcomes, each as its own stratum, so ``per_category=5`` with both included gives up to
5 kept, 5 rejected and 5 failed sessions of every category (a rare outcome is not drowned by the
common one). The pick depends only on the seed and the sample keys (``raygen.eval.strata``): the same
command gives the same sample, even after a re-merge.

``sample.jsonl`` holds the records exactly as the run wrote them plus one ``review_sample`` object
(outcome, reason, source file and line); ``sample.md`` renders each of them turn by turn.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.eval.markdown import code, text, trajectory_markdown
from raygen.eval.runread import iter_run_records, load_run
from raygen.eval.strata import StratifiedSampler
from raygen.output.filters import FAILED, KEPT, OUTCOMES, REJECTED
from raygen.output.run_dir import SAMPLE_DIR, RunDir
from raygen.output.shards import RecordReader

INCLUDABLE = (REJECTED, FAILED)


@dataclass
class SampleResult:
    """What ``write_sample`` wrote (URIs when written into a run folder on an object store)."""

    out_dir: Path | str
    jsonl: Path | str
    markdown: Path | str
    picked: dict[tuple[str, str], int] = field(default_factory=dict)
    """Sessions written per (category, outcome)."""
    population: dict[tuple[str, str], int] = field(default_factory=dict)
    """Sessions in the run per (category, outcome), for the sampled outcomes."""

    @property
    def total(self) -> int:
        return sum(self.picked.values())


def parse_include(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"rejected,failed"`` -> ``("rejected", "failed")``; unknown names raise ``ValueError``."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in INCLUDABLE]
    if unknown:
        raise ValueError(
            f"--include takes {', '.join(INCLUDABLE)} (comma-separated), not {', '.join(unknown)}"
        )
    return tuple(n for n in INCLUDABLE if n in names)


def _line_safe(text: str) -> str:
    """Escape the characters ``str.splitlines`` breaks lines at that JSON leaves raw (U+2028, U+2029,
    U+0085): the file stays one record per line for every reader, not only those splitting at \\n."""
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")


def _write_atomic(path: Path, chunks: Iterable[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for chunk in chunks:
            fh.write(chunk)
    os.replace(tmp, path)


def _markdown_header(name: str, seed: int, per_category: int, result: SampleResult) -> str:
    outcomes = sorted({o for _, o in result.population}, key=OUTCOMES.index)
    lines = [
        f"# Review sample of run {code(name)}\n",
        f"Seed {seed}, up to {per_category} sessions per category and outcome ({', '.join(outcomes)}); "
        f"{result.total} sessions. Full records: `sample.jsonl`.\n",
        "| category | " + " | ".join(f"{o} (sampled / in run)" for o in outcomes) + " |",
        "|---|" + "---:|" * len(outcomes),
    ]
    for cat in sorted({c for c, _ in result.population}):
        cells = [f"{result.picked.get((cat, o), 0)} / {result.population.get((cat, o), 0)}" for o in outcomes]
        lines.append(f"| {text(cat)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n"


def write_sample(
    run_dir: RunDir | str | Path,
    out_dir: str | Path | None = None,
    *,
    per_category: int,
    seed: int = 0,
    include: Iterable[str] = (),
) -> SampleResult:
    """Sample the run (see the module docstring) into ``out_dir`` (default ``RUN_DIR/sample``)."""
    if per_category < 1:
        raise ValueError("per_category must be >= 1")
    info = load_run(run_dir)
    outcomes = (KEPT, *parse_include(list(include)))
    sampler = StratifiedSampler(per_category, seed)
    for item in iter_run_records(info.run_dir, outcomes):
        sampler.offer(
            (item.category, item.outcome), item.key, (item.pos, item.line, item.outcome, item.reason)
        )
    upload = out_dir is None and not info.run_dir.is_local  # into the run folder on its object store
    if upload:
        out = Path(tempfile.mkdtemp(prefix="raygen-sample-"))
    else:
        out = Path(out_dir) if out_dir is not None else info.run_dir.local_path / SAMPLE_DIR
    out.mkdir(parents=True, exist_ok=True)
    result = SampleResult(out, out / "sample.jsonl", out / "sample.md", population=dict(sampler.offered))
    strata = sampler.strata()
    order = sorted(strata, key=lambda s: (s[0], OUTCOMES.index(s[1])))
    picks = [item for stratum in order for item in strata[stratum]]
    for stratum in order:
        result.picked[stratum] = len(strata[stratum])

    _write_atomic(result.jsonl, _jsonl_lines(info.run_dir, picks))
    header = _markdown_header(info.name, seed, per_category, result)
    _write_atomic(result.markdown, _markdown_parts(header, info.run_dir, picks))
    if upload:
        for local in (result.jsonl, result.markdown):
            info.run_dir.replace_from(Path(local), f"{SAMPLE_DIR}/{Path(local).name}")
        out.rmdir()
        result.out_dir = info.run_dir.describe(SAMPLE_DIR)
        result.jsonl = info.run_dir.describe(SAMPLE_DIR, "sample.jsonl")
        result.markdown = info.run_dir.describe(SAMPLE_DIR, "sample.md")
    return result


def _records(run_dir: RunDir, picks: list[tuple]) -> Iterable[tuple[dict[str, Any], tuple]]:
    """Each picked record, read by its position, with its pick ``(pos, line, outcome, reason)``."""
    with RecordReader(run_dir=run_dir) as reader:
        for pick in picks:
            yield reader.read(pick[0]), pick


def _jsonl_lines(run_dir: RunDir, picks: list[tuple]) -> Iterable[str]:
    for record, (pos, line, outcome, reason) in _records(run_dir, picks):
        record["review_sample"] = {
            "outcome": outcome,
            "reason": reason,
            "file": run_dir.relative(pos.path),
            "line": line,
        }
        yield _line_safe(json.dumps(record, ensure_ascii=False)) + "\n"


def _markdown_parts(header: str, run_dir: RunDir, picks: list[tuple]) -> Iterable[str]:
    yield header
    for number, (record, (_pos, _line, outcome, reason)) in enumerate(_records(run_dir, picks), start=1):
        yield trajectory_markdown(record, outcome, reason, number) + "\n---\n\n"
