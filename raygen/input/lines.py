"""One line of a prompts file: read (bounded), parsed and checked into a row, with every problem found.

``raygen.input.validate`` reads a whole file with these (``scan_dataset``, ``iter_samples``), and so does
the hygiene scan: what the scan accepts is exactly what the planning read yields. A line longer than
``MAX_LINE_BYTES`` is skipped without being held.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from pydantic import ValidationError

from raygen.input.rows import ROW_FIELDS, PromptRow

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Lines longer than this are reported and skipped unread (the longest real prompt line is ~21 KB)."""

BOM = b"\xef\xbb\xbf"
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


def did_you_mean(name: str, choices: list[str] | tuple[str, ...]) -> str:
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
        hint = did_you_mean(key, ROW_FIELDS)
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
    if line == 1 and raw.startswith(BOM):
        raw, offset = raw[len(BOM) :], len(BOM)
    if not raw.strip():
        return None
    parsed = ParsedLine(None)
    data = _json_object(path, line, raw, offset, parsed)
    if data is None:
        return parsed
    parsed.data = data
    _accept_aliases(path, line, data, parsed)
    _move_unknown_fields(path, line, data, parsed)
    _check_values(path, line, raw, data, parsed)
    try:
        row = PromptRow.model_validate(data)
    except ValidationError as exc:
        parsed.problems.extend(_pydantic_problems(path, line, exc))
        return parsed
    if not parsed.problems:
        parsed.row = row
    return parsed


def _json_object(path: str, line: int, raw: bytes, offset: int, parsed: ParsedLine) -> dict[str, Any] | None:
    """The line's JSON object, or None with the problem (not UTF-8, not JSON, not an object) in ``parsed``.
    ``offset``: the bytes (a BOM) already cut from the line's start, for the column."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = exc.start + offset + 1
        parsed.problems.append(Problem(path, line, "(utf-8)", f"invalid UTF-8 at byte column {column}"))
        return None
    try:
        data = json.loads(text, parse_constant=_NonFinite)
    except json.JSONDecodeError as exc:
        parsed.problems.append(
            Problem(path, line, "(json)", f"invalid JSON: {exc.msg} at column {exc.colno}")
        )
        return None
    except RecursionError:
        parsed.problems.append(Problem(path, line, "(json)", "invalid JSON: nested too deeply"))
        return None
    if not isinstance(data, dict):
        parsed.problems.append(
            Problem(path, line, "(row)", f"expected a JSON object, got {_json_type(data)}")
        )
        return None
    return data


def _check_values(path: str, line: int, raw: bytes, data: dict[str, Any], parsed: ParsedLine) -> None:
    """Values JSON can spell but the output cannot hold: lone surrogate escapes, NaN and Infinity."""
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


def read_lines(handle: BinaryIO, hasher: Any = None) -> Iterator[tuple[int, bytes | None, int]]:
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
