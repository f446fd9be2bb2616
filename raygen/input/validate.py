"""Validate a prompts JSONL file in one streaming pass, then stream its samples in a second.

Both passes read the file line by line in binary mode and share one line parser (``parse_line``), so
what the scan accepts is exactly what ``iter_samples`` yields. Memory stays bounded by the number of
rows (a dict of ids and of prompt digests), never by the file's size: lines longer than
``MAX_LINE_BYTES`` are skipped without being held, and at most ``MAX_STORED`` problems and notices
are kept (the rest are only counted).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from pydantic import ValidationError

from raygen.errors import InputError
from raygen.input.rows import ROW_FIELDS, PromptRow, Sample, make_sample_key

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Lines longer than this are reported and skipped unread (the longest real prompt line is ~21 KB)."""
LARGE_LINE_BYTES = 1024 * 1024
"""Lines longer than this get a warning: every model call of the sample sends the prompt again, and the
record stores it twice (raygen/input/README.md)."""
MAX_STORED = 1000
"""Problems (and, separately, notices) kept in a report; further ones are only counted."""

_BOM = b"\xef\xbb\xbf"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


@dataclass(frozen=True)
class Finding:
    """Something found on one line. ``field`` is a path such as ``env.FOO``, ``toolsets[1]`` or, for the
    line as a whole, ``(utf-8)``, ``(json)``, ``(row)``, ``(line)`` or ``(file)``."""

    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path  # line 0: a file with no lines
        return f"{where}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Problem(Finding):
    """An error: the row is not used and the dataset does not pass."""


@dataclass(frozen=True)
class Notice(Finding):
    """A warning: the row is used as it is (or as described in ``message``)."""


@dataclass
class ParsedLine:
    """What ``parse_line`` made of one non-blank line."""

    row: PromptRow | None
    """The validated row, or None if ``problems`` is not empty."""
    data: dict[str, Any] | None = None
    """The decoded JSON object (unknown fields already moved into metadata), if it was an object."""
    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)


class ToolsetDrawer(Protocol):
    """Anything that picks a sample's toolsets, e.g. ``raygen.tools.distributions.BoundDistribution``."""

    def draw(self, run_seed: int, sample_key: str) -> list[str]: ...


def _json_type(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "number"
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(row)"


def _did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _pydantic_problems(path: str, line: int, error: ValidationError) -> list[Problem]:
    # One Problem per field, even if pydantic reports several errors at the same location.
    by_field: dict[str, list[str]] = {}
    for err in error.errors():
        if err["type"] == "missing":
            message = "missing (required)"
        elif err["type"] == "value_error":
            message = err["msg"].removeprefix("Value error, ")
        else:
            message = f"{err['msg']} (got {_json_type(err.get('input'))})"
        by_field.setdefault(_field_path(err["loc"]), []).append(message)
    return [Problem(path, line, name, "; ".join(msgs)) for name, msgs in by_field.items()]


def _has_lone_surrogate(value: Any) -> bool:
    # JSON may spell a lone surrogate (\ud800), which Python accepts but can never be written as UTF-8;
    # catching it here beats a crash when the trajectory is written.
    return isinstance(value, str) and _LONE_SURROGATE.search(value) is not None


class _NonFinite:
    """Stands for a ``NaN``/``Infinity`` literal: Python's json accepts them, JSON does not, and the
    output would store them as null without a word."""

    def __init__(self, literal: str):
        self.literal = literal


def _find_bad(value: Any, where: str, bad: Any) -> str | None:
    """Path of the first value (or key) for which ``bad`` is true, e.g. ``metadata.score``."""
    if bad(value):
        return where or "(row)"
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and bad(key):
            return where or "(row)"
        sub = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)
        found = _find_bad(item, sub, bad)
        if found is not None:
            return found
    return None


FIELD_ALIASES = {"docker_image": "image"}
"""Row fields under another name, as the reference runner (Hermes Agent's batch_runner) spells them."""


def _accept_aliases(path: str, line: int, data: dict[str, Any], parsed: ParsedLine) -> None:
    for alias, name in FIELD_ALIASES.items():
        if alias not in data:
            continue
        value = data.pop(alias)
        if name in data and data[name] != value:
            parsed.problems.append(Problem(path, line, alias, f"differs from {name!r}; set only one of them"))
        else:
            data[name] = value


def _move_unknown_fields(path: str, line: int, data: dict[str, Any], parsed: ParsedLine) -> None:
    """Move top-level keys that are not row fields into ``metadata`` (each one reported as a Notice)."""
    unknown = [key for key in data if key not in ROW_FIELDS]
    if not unknown:
        return
    metadata = data.get("metadata", {})
    movable = isinstance(metadata, dict)
    metadata = dict(metadata) if movable else metadata
    for key in unknown:
        value = data.pop(key)
        hint = _did_you_mean(key, ROW_FIELDS)
        if not movable:
            # metadata itself is invalid and reported by pydantic; there is nowhere to put the field.
            parsed.notices.append(Notice(path, line, key, f"unknown field{hint}"))
            continue
        if key not in metadata:
            metadata[key] = value
            where = f"metadata[{key!r}]"
        else:
            extras = metadata.get("_extra_fields", {})
            if not isinstance(extras, dict):
                parsed.problems.append(
                    Problem(path, line, key, "unknown field, and metadata._extra_fields is not an object")
                )
                continue
            metadata["_extra_fields"] = {**extras, key: value}
            where = f"metadata['_extra_fields'][{key!r}]"
        parsed.notices.append(Notice(path, line, key, f"unknown field, moved to {where}{hint}"))
    if movable:
        data["metadata"] = metadata


def parse_line(path: str, line: int, raw: bytes | None, raw_size: int = 0) -> ParsedLine | None:
    """Parse one line into a row, collecting every problem found. Returns None for a blank line.

    ``raw`` is None for a line longer than ``MAX_LINE_BYTES`` (of ``raw_size`` bytes), which was skipped.
    """
    if raw is None:
        return ParsedLine(
            None, problems=[Problem(path, line, "(line)", f"line is {raw_size} bytes, over {MAX_LINE_BYTES}")]
        )
    offset = 0
    if line == 1 and raw.startswith(_BOM):
        raw, offset = raw[len(_BOM) :], len(_BOM)
    if not raw.strip():
        return None
    parsed = ParsedLine(None)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = exc.start + offset + 1
        parsed.problems.append(Problem(path, line, "(utf-8)", f"invalid UTF-8 at byte column {column}"))
        return parsed
    try:
        data = json.loads(text, parse_constant=_NonFinite)
    except json.JSONDecodeError as exc:
        parsed.problems.append(
            Problem(path, line, "(json)", f"invalid JSON: {exc.msg} at column {exc.colno}")
        )
        return parsed
    except RecursionError:
        parsed.problems.append(Problem(path, line, "(json)", "invalid JSON: nested too deeply"))
        return parsed
    if not isinstance(data, dict):
        parsed.problems.append(
            Problem(path, line, "(row)", f"expected a JSON object, got {_json_type(data)}")
        )
        return parsed
    parsed.data = data
    _accept_aliases(path, line, data, parsed)
    _move_unknown_fields(path, line, data, parsed)
    bad_string = None
    # Strict UTF-8 decoding already refused raw surrogates; only a \u escape can spell one.
    if b"\\u" in raw:
        try:
            bad_string = _find_bad(data, "", _has_lone_surrogate)
        except RecursionError:
            bad_string = "(row)"
    if bad_string is not None:
        parsed.problems.append(Problem(path, line, bad_string, "contains a lone UTF-16 surrogate escape"))
    if b"NaN" in raw or b"Infinity" in raw:
        try:
            where = _find_bad(data, "", lambda v: isinstance(v, _NonFinite))
        except RecursionError:
            where = "(row)"
        if where is not None:
            message = "NaN/Infinity is not JSON (it would be stored as null); use null or a string"
            parsed.problems.append(Problem(path, line, where, message))
    try:
        row = PromptRow.model_validate(data)
    except ValidationError as exc:
        parsed.problems.extend(_pydantic_problems(path, line, exc))
        return parsed
    if not parsed.problems:
        parsed.row = row
    return parsed


def _read_lines(handle: BinaryIO, hasher: Any = None) -> Iterator[tuple[int, bytes | None, int]]:
    """Yield ``(line_number, bytes or None if too long, size)``; feed every byte to ``hasher``."""
    line_no = 0
    limit = MAX_LINE_BYTES
    while chunk := handle.readline(limit + 1):
        line_no += 1
        if hasher is not None:
            hasher.update(chunk)
        if len(chunk) <= limit or chunk.endswith(b"\n"):
            yield line_no, chunk, len(chunk)
            continue
        size = len(chunk)
        while not chunk.endswith(b"\n") and (chunk := handle.readline(1 << 20)):
            size += len(chunk)
            if hasher is not None:
                hasher.update(chunk)
        yield line_no, None, size


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
    report = DatasetReport(path=str(path))
    hasher = hashlib.sha256()
    first_line_of_id: dict[str, int] = {}
    first_line_of_prompt: dict[bytes, int] = {}
    categories: Counter[str] = Counter()
    first_line, starts_array = None, False
    with _open(path) as handle:
        for line, raw, size in _read_lines(handle, hasher):
            report.lines, report.size_bytes = line, report.size_bytes + size
            parsed = parse_line(str(path), line, raw, size)
            if parsed is None:
                continue
            if first_line is None:
                first_line, starts_array = (
                    line,
                    raw is not None and raw.lstrip(_BOM + b" \t\r\n").startswith(b"["),
                )
            if size > LARGE_LINE_BYTES and raw is not None:
                message = f"line is {size} bytes (over {LARGE_LINE_BYTES}); each model call resends it"
                report.add_notice(Notice(str(path), line, "(line)", message))
            for notice in parsed.notices:
                report.add_notice(notice)
            problems = list(parsed.problems)
            raw_id = parsed.data.get("id") if parsed.data is not None else None
            if isinstance(raw_id, str):
                # Ids of invalid rows count too, so fixing one line never reveals a new duplicate.
                if raw_id in first_line_of_id:
                    earlier = first_line_of_id[raw_id]
                    problems.append(
                        Problem(str(path), line, "id", f"duplicate id {raw_id!r} (line {earlier})")
                    )
                else:
                    first_line_of_id[raw_id] = line
            row = parsed.row
            if row is not None and on_row is not None:
                on_row(line, row)
            if row is not None and known_toolsets is not None:
                problems.extend(_toolset_problems(str(path), line, row, known_toolsets))
            for problem in problems:
                report.add_problem(problem)
            if row is None or problems:
                continue
            report.rows += 1
            categories[row.category if row.category is not None else "(none)"] += 1
            report.with_image += row.image is not None
            if row.toolsets == []:
                report.add_notice(Notice(str(path), line, "toolsets", "empty list: this row gets no tools"))
            digest = hashlib.blake2b(row.prompt.encode("utf-8"), digest_size=16).digest()
            if digest in first_line_of_prompt:
                report.identical_prompts += 1
                earlier = first_line_of_prompt[digest]
                report.add_notice(
                    Notice(
                        str(path), line, "prompt", f"same prompt as line {earlier}; kept as a separate sample"
                    )
                )
            else:
                first_line_of_prompt[digest] = line
    if starts_array and not report.ok:
        # A JSON array (pretty-printed or not) fails line by line with no word of why.
        hint = "the file is a JSON array, not JSON Lines (one object per line); convert it: jq -c '.[]' FILE"
        report.problems.insert(0, Problem(str(path), first_line or 1, "(file)", hint))
        report.problem_count += 1
    report.sha256 = hasher.hexdigest()
    report.per_category = dict(sorted(categories.items()))
    if report.rows == 0 and report.problem_count == 0:
        report.add_problem(
            Problem(str(path), report.lines, "(file)", "no rows: the file has only blank lines")
        )
    return report


def _toolset_problems(path: str, line: int, row: PromptRow, known: set[str]) -> list[Problem]:
    choices = sorted(known)
    return [
        Problem(
            path,
            line,
            f"toolsets[{i}]",
            f"unknown toolset {name!r}{_did_you_mean(name, choices)} (known: {', '.join(choices) or 'none'})",
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
        for line, raw, size in _read_lines(handle):
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
