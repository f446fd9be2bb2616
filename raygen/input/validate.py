"""Validate a prompts JSONL file in one streaming pass, then stream its samples in a second.

Both passes read the file line by line in binary mode and share one line parser (``parse_line``,
``raygen.input.lines``), so what the scan accepts is exactly what ``iter_samples`` yields. Memory stays
bounded by the number of rows (a dict of ids and of prompt digests), never by the file's size: lines
longer than ``MAX_LINE_BYTES`` are skipped without being held, and at most ``MAX_STORED`` problems and
notices are kept (the rest are only counted).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from raygen.errors import InputError
from raygen.input.lines import BOM, Notice, ParsedLine, Problem, did_you_mean, parse_line, read_lines
from raygen.input.rows import PromptRow, Sample, make_sample_key

LARGE_LINE_BYTES = 1024 * 1024
"""Lines longer than this get a warning: every model call of the sample sends the prompt again, and the
record stores it twice (raygen/input/README.md)."""
MAX_STORED = 1000
"""Problems (and, separately, notices) kept in a report; further ones are only counted."""


class ToolsetDrawer(Protocol):
    """Anything that picks a sample's toolsets, e.g. ``raygen.tools.distributions.BoundDistribution``."""

    def draw(self, run_seed: int, sample_key: str) -> list[str]: ...


@dataclass
class DatasetReport:
    """The outcome of ``scan_dataset``: counts, and every problem and notice (up to ``MAX_STORED``)."""

    path: str
    sha256: str = ""
    size_bytes: int = 0
    lines: int = 0
    rows: int = 0
    """Valid rows."""
    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    problem_count: int = 0
    """All problems found, including those not stored."""
    notice_count: int = 0
    per_category: dict[str, int] = field(default_factory=dict)
    """Valid rows per category; rows without one count under ``(none)``."""
    with_image: int = 0
    identical_prompts: int = 0
    """Valid rows whose prompt text repeats an earlier row's."""

    @property
    def ok(self) -> bool:
        """True when no line has a problem (notices are fine)."""
        return self.problem_count == 0

    def add_problem(self, problem: Problem) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_STORED:
            self.problems.append(problem)

    def add_notice(self, notice: Notice) -> None:
        self.notice_count += 1
        if len(self.notices) < MAX_STORED:
            self.notices.append(notice)

    def summary_lines(self) -> list[str]:
        """Human-readable summary for the CLI (counts only; print ``problems``/``notices`` for details)."""
        categories = ", ".join(f"{name} {count}" for name, count in sorted(self.per_category.items()))
        out = [
            f"{self.path}: {self.rows} valid rows in {self.lines} lines "
            f"({self.size_bytes:,} bytes, sha256 {self.sha256[:16]})",
            f"per category: {categories or '(no rows)'}",
            f"rows with an image: {self.with_image}",
            f"identical prompts: {self.identical_prompts} (each kept as a separate sample)",
            f"problems: {self.problem_count}{_not_shown(self.problem_count, len(self.problems))}",
            f"notices: {self.notice_count}{_not_shown(self.notice_count, len(self.notices))}",
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``raygen validate --json``)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def raise_if_invalid(self) -> None:
        """Raise ``InputError`` carrying the stored problems if the file has any."""
        if not self.ok:
            first = "\n".join(str(p) for p in self.problems[:20])
            more = self.problem_count - min(20, len(self.problems))
            tail = f"\n... and {more} more" if more > 0 else ""
            raise InputError(
                f"{self.path}: {self.problem_count} invalid line(s):\n{first}{tail}", self.problems
            )


def _not_shown(total: int, stored: int) -> str:
    return f" (first {stored} listed, {total - stored} more not listed)" if total > stored else ""


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc


def scan_dataset(
    path: str | Path,
    known_toolsets: set[str] | None = None,
    on_row: Callable[[int, PromptRow], None] | None = None,
) -> DatasetReport:
    """Check every line of a prompts JSONL file; never stops at the first problem.

    ``known_toolsets``, if given, also checks each row's ``toolsets`` names. ``on_row(line, row)`` sees
    each row that parsed (as ``iter_valid_rows`` yields them), so other checks share this read.
    """
    path = Path(path)
    scan = _DatasetScan(str(path), known_toolsets, on_row)
    hasher = hashlib.sha256()
    with _open(path) as handle:
        for line, raw, size in read_lines(handle, hasher):
            scan.add(line, raw, size)
    return scan.finish(hasher.hexdigest())


class _DatasetScan:
    """One ``scan_dataset`` read: the report so far, and what earlier lines held (ids, prompt digests)."""

    def __init__(
        self, path: str, known_toolsets: set[str] | None, on_row: Callable[[int, PromptRow], None] | None
    ):
        self.path, self.known_toolsets, self.on_row = path, known_toolsets, on_row
        self.report = DatasetReport(path=path)
        self.first_line_of_id: dict[str, int] = {}
        self.first_line_of_prompt: dict[bytes, int] = {}
        self.categories: Counter[str] = Counter()
        self.first_line: int | None = None
        self.starts_array = False

    def add(self, line: int, raw: bytes | None, size: int) -> None:
        """Line ``line`` (``raw`` None: over ``MAX_LINE_BYTES``, skipped) into the report."""
        report, path = self.report, self.path
        report.lines, report.size_bytes = line, report.size_bytes + size
        parsed = parse_line(path, line, raw, size)
        if parsed is None:
            return
        if self.first_line is None:
            self.first_line = line
            self.starts_array = raw is not None and raw.lstrip(BOM + b" \t\r\n").startswith(b"[")
        if size > LARGE_LINE_BYTES and raw is not None:
            message = f"line is {size} bytes (over {LARGE_LINE_BYTES}); each model call resends it"
            report.add_notice(Notice(path, line, "(line)", message))
        for notice in parsed.notices:
            report.add_notice(notice)
        problems = [*parsed.problems, *self._duplicate_id(line, parsed)]
        row = parsed.row
        if row is not None and self.on_row is not None:
            self.on_row(line, row)
        if row is not None and self.known_toolsets is not None:
            problems.extend(_toolset_problems(path, line, row, self.known_toolsets))
        for problem in problems:
            report.add_problem(problem)
        if row is not None and not problems:
            self._count_row(line, row)

    def _duplicate_id(self, line: int, parsed: ParsedLine) -> list[Problem]:
        raw_id = parsed.data.get("id") if parsed.data is not None else None
        if not isinstance(raw_id, str):
            return []
        # Ids of invalid rows count too, so fixing one line never reveals a new duplicate.
        if raw_id in self.first_line_of_id:
            earlier = self.first_line_of_id[raw_id]
            return [Problem(self.path, line, "id", f"duplicate id {raw_id!r} (line {earlier})")]
        self.first_line_of_id[raw_id] = line
        return []

    def _count_row(self, line: int, row: PromptRow) -> None:
        """A valid row into the counts (category, image, identical prompts) and its notices."""
        report, path = self.report, self.path
        report.rows += 1
        self.categories[row.category if row.category is not None else "(none)"] += 1
        report.with_image += row.image is not None
        if row.toolsets == []:
            report.add_notice(Notice(path, line, "toolsets", "empty list: this row gets no tools"))
        digest = hashlib.blake2b(row.prompt.encode("utf-8"), digest_size=16).digest()
        if digest in self.first_line_of_prompt:
            report.identical_prompts += 1
            earlier = self.first_line_of_prompt[digest]
            report.add_notice(
                Notice(path, line, "prompt", f"same prompt as line {earlier}; kept as a separate sample")
            )
        else:
            self.first_line_of_prompt[digest] = line

    def finish(self, sha256: str) -> DatasetReport:
        """The report, with what only the whole file tells (a JSON array, no rows at all)."""
        report, path = self.report, self.path
        if self.starts_array and not report.ok:
            # A JSON array (pretty-printed or not) fails line by line with no word of why.
            hint = (
                "the file is a JSON array, not JSON Lines (one object per line); convert it: jq -c '.[]' FILE"
            )
            report.problems.insert(0, Problem(path, self.first_line or 1, "(file)", hint))
            report.problem_count += 1
        report.sha256 = sha256
        report.per_category = dict(sorted(self.categories.items()))
        if report.rows == 0 and report.problem_count == 0:
            no_rows = "no rows: the file has only blank lines"
            report.add_problem(Problem(path, report.lines, "(file)", no_rows))
        return report


def _toolset_problems(path: str, line: int, row: PromptRow, known: set[str]) -> list[Problem]:
    choices = sorted(known)
    return [
        Problem(
            path,
            line,
            f"toolsets[{i}]",
            f"unknown toolset {name!r}{did_you_mean(name, choices)} (known: {', '.join(choices) or 'none'})",
        )
        for i, name in enumerate(row.toolsets or [])
        if name not in known
    ]


def iter_samples(
    path: str | Path,
    *,
    run_seed: int,
    distribution: ToolsetDrawer,
    limit: int | None = None,
    samples_per_prompt: int = 1,
) -> Iterator[Sample]:
    """Stream the samples of a file that ``scan_dataset`` found clean, in file order.

    A row's ``toolsets`` override the distribution's draw. ``limit`` takes the first N valid rows.
    ``samples_per_prompt`` K > 1 yields K samples per row, a group (``group_id``, ``sample_index``; see
    ``group_sample_keys``). Raises ``InputError`` if a line turns out invalid (the file changed since the
    scan).
    """
    path = Path(path)
    if limit is not None and limit <= 0:
        return
    occurrences: Counter[str] = Counter()
    prompt_index = 0
    with _open(path) as handle:
        for line, raw, size in read_lines(handle):
            parsed = parse_line(str(path), line, raw, size)
            if parsed is None:
                continue
            if parsed.row is None:
                detail = "; ".join(str(p) for p in parsed.problems)
                raise InputError(f"dataset changed since it was validated: {detail}", parsed.problems)
            row = parsed.row
            content_hash = row.content_hash()
            sample_key = make_sample_key(content_hash, occurrences[content_hash])
            occurrences[content_hash] += 1
            if row.toolsets is not None:
                toolsets = sorted(set(row.toolsets))
            else:  # drawn once per row: every sample of a group is offered the same tools
                toolsets = distribution.draw(run_seed, sample_key)
            group_id = sample_key if samples_per_prompt > 1 else None
            for index, key in enumerate(group_sample_keys(sample_key, samples_per_prompt)):
                yield Sample(
                    row=row,
                    sample_key=key,
                    prompt_index=prompt_index,
                    line=line,
                    toolsets=toolsets,
                    group_id=group_id,
                    sample_index=index,
                )
            prompt_index += 1
            if limit is not None and prompt_index >= limit:
                return


def group_sample_keys(row_key: str, samples_per_prompt: int) -> list[str]:
    """The sample keys of a row's group: the row's own key first (so a run with K = 1 resumes into
    K > 1 keeping its samples), then one derived key per further sample."""
    extra = [
        hashlib.sha256(f"{row_key}:sample:{i}".encode()).hexdigest()[:24]
        for i in range(1, samples_per_prompt)
    ]
    return [row_key, *extra]
