"""One streaming pass over a prompts file -> ``HygieneReport``: secrets, personal data, eval-set overlap.

Every string a row sends to the model or into the output is searched: the prompt, ``cwd``, each ``env``
value and every string inside ``metadata``. Values of ``env`` variables declared secret
(``session.secret_env``) are skipped: they are expected there and are redacted from trajectories. Found
values are kept only masked. Invalid lines are skipped (``raygen validate`` reports them); memory is
bounded by ``MAX_STORED`` findings plus the evaluation-set index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raygen.config import HygieneConfig
from raygen.errors import ConfigError, InputError
from raygen.hygiene.pii import find_pii, mask_pii, phone_region_valid
from raygen.hygiene.secrets import find_secrets, mask_secret
from raygen.input.rows import PromptRow
from raygen.input.validate import parse_line
from raygen.safety import default_rules

MAX_STORED = 1000
"""Findings (and, separately, overlaps) kept in a report; further ones are only counted."""
SECRET, PII = "secret", "pii"


@dataclass(frozen=True)
class HygieneFinding:
    """A secret or a piece of personal data in one field of one line; the value is masked."""

    path: str
    line: int
    field: str
    category: str
    """``secret`` or ``pii``."""
    kind: str
    """e.g. ``AWS Access Key``, ``Private Key``, ``email``, ``phone``, ``card_number``."""
    masked: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.category} {self.kind}: {self.masked}"


@dataclass(frozen=True)
class OverlapFinding:
    """A prompt that also occurs in the evaluation set."""

    path: str
    line: int
    kind: str
    """``exact`` or ``near``."""
    eval_line: int
    similarity: float

    def __str__(self) -> str:
        how = "same text" if self.kind == "exact" else f"near duplicate, similarity {self.similarity:.2f}"
        return f"{self.path}:{self.line}: prompt: also in the eval set at line {self.eval_line} ({how})"


@dataclass
class HygieneReport:
    """What ``scan_hygiene`` found; values appear only masked."""

    path: str
    rows: int = 0
    """Valid rows scanned."""
    rows_with_findings: int = 0
    """Rows with at least one secret, piece of personal data or eval-set overlap."""
    findings: list[HygieneFinding] = field(default_factory=list)
    finding_count: int = 0
    secrets: dict[str, int] = field(default_factory=dict)
    """Secrets found, by kind."""
    pii: dict[str, int] = field(default_factory=dict)
    """Personal data found, by kind."""
    eval_set: str | None = None
    eval_rows: int = 0
    overlaps: list[OverlapFinding] = field(default_factory=list)
    overlap_counts: dict[str, int] = field(default_factory=lambda: {"exact": 0, "near": 0})
    unsafe_commands: dict[str, int] = field(default_factory=dict)
    """Rows whose prompt holds a command matching the unsafe-action rules, by label (informational:
    not a finding)."""

    @property
    def overlap_count(self) -> int:
        return sum(self.overlap_counts.values())

    @property
    def has_findings(self) -> bool:
        """True when a secret, personal data or an eval-set overlap was found."""
        return self.finding_count > 0 or self.overlap_count > 0

    def add_finding(self, finding: HygieneFinding) -> None:
        self.finding_count += 1
        bucket = self.secrets if finding.category == SECRET else self.pii
        bucket[finding.kind] = bucket.get(finding.kind, 0) + 1
        if len(self.findings) < MAX_STORED:
            self.findings.append(finding)

    def add_overlap(self, overlap: OverlapFinding) -> None:
        self.overlap_counts[overlap.kind] += 1
        if len(self.overlaps) < MAX_STORED:
            self.overlaps.append(overlap)

    def summary_lines(self) -> list[str]:
        """Counts for the CLI (print ``findings`` and ``overlaps`` for the lines)."""
        out = [
            f"hygiene: {self.rows} rows scanned; {sum(self.secrets.values())} secrets, "
            f"{sum(self.pii.values())} personal data, {self.overlap_count} eval-set overlaps, "
            f"in {self.rows_with_findings} rows"
        ]
        if self.secrets:
            out.append("  secrets: " + _counts(self.secrets))
        if self.pii:
            out.append("  personal data: " + _counts(self.pii))
        if self.eval_set is not None:
            out.append(
                f"  eval set {self.eval_set} ({self.eval_rows} rows): {self.overlap_count} prompts also "
                f"in it (exact {self.overlap_counts['exact']}, near {self.overlap_counts['near']})"
            )
        if self.unsafe_commands:
            out.append("  commands in prompts matching unsafe-action rules: " + _counts(self.unsafe_commands))
        shown = len(self.findings) + len(self.overlaps)
        if self.finding_count + self.overlap_count > shown:
            out.append(f"  (first {shown} listed, {self.finding_count + self.overlap_count - shown} more)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``raygen hygiene --json``); values are masked."""
        out = asdict(self)
        out["has_findings"] = self.has_findings
        return out

    def statistics(self) -> dict[str, Any]:
        """Counts only, for ``statistics.json``."""
        return {
            "rows_scanned": self.rows,
            "rows_with_findings": self.rows_with_findings,
            "secrets": dict(sorted(self.secrets.items())),
            "pii": dict(sorted(self.pii.items())),
            "eval_overlap": dict(self.overlap_counts) if self.eval_set is not None else None,
            "unsafe_commands_in_prompts": dict(sorted(self.unsafe_commands.items())),
        }


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _row_strings(row: PromptRow, skip_env: set[str]) -> Iterator[tuple[str, str]]:
    """``(field path, text)`` of every string a row carries into a session or its record."""
    yield "prompt", row.prompt
    if row.cwd:
        yield "cwd", row.cwd
    for name, value in row.env.items():
        if name not in skip_env:
            # Searched as NAME=value, so a variable named like a secret is judged with its name.
            yield f"env.{name}", f"{name}={value}"
    yield from _nested_strings(row.metadata, "metadata")


def _nested_strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nested_strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nested_strings(item, f"{where}[{i}]")


def scan_text(text: str, config: HygieneConfig) -> Iterator[tuple[str, str, str]]:
    """``(category, kind, masked value)`` of every secret and piece of personal data in ``text``; text
    found as a secret is not reported again as personal data (``https://user:pw@host`` is no email)."""
    secrets = find_secrets(text) if config.secrets else []
    for hit in secrets:
        yield SECRET, hit.kind, mask_secret(text[hit.start : hit.end])
    if config.pii:
        for pii in find_pii(text, config.phone_region):
            if not any(pii.start < s.end and s.start < pii.end for s in secrets):
                yield PII, pii.kind, mask_pii(pii.kind, text[pii.start : pii.end])


class _ShortTextMemo:
    """``scan_text`` remembered for the short strings beside the prompt: metadata values (categories,
    difficulties, sources), ``cwd`` and ``env`` values repeat on most rows of a prompts file, and each
    costs as much to scan as a short prompt. (Prompts are scanned each time: they rarely repeat.)"""

    MAX_CHARS, MAX_ENTRIES = 200, 50_000

    def __init__(self, config: HygieneConfig):
        self.config = config
        self.seen: dict[str, list[tuple[str, str, str]]] = {}

    def scan(self, text: str) -> list[tuple[str, str, str]]:
        if len(text) > self.MAX_CHARS:
            return list(scan_text(text, self.config))
        found = self.seen.get(text)
        if found is None:
            found = list(scan_text(text, self.config))
            if len(self.seen) < self.MAX_ENTRIES:
                self.seen[text] = found
        return found


def iter_valid_rows(path: Path, limit: int | None = None) -> Iterator[tuple[int, PromptRow]]:
    """``(line, row)`` of the valid rows of a prompts file, the first ``limit`` of them if given."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read dataset {path}: {exc.strerror or exc}") from exc
    valid = 0
    with handle:
        for line_no, raw in enumerate(handle, 1):
            parsed = parse_line(str(path), line_no, raw, len(raw))
            if parsed is None or parsed.row is None:
                continue
            yield line_no, parsed.row
            valid += 1
            if limit is not None and valid >= limit:
                return


class HygieneScan:
    """The hygiene scan fed row by row, so the driver's validation pass does it too (one read of the
    dataset for both): ``add`` each valid row, then ``finish`` for the report."""

    def __init__(self, path: str | Path, config: HygieneConfig | None = None, secret_env: Iterable[str] = ()):
        self.config = config = config or HygieneConfig()
        if not phone_region_valid(config.phone_region):
            raise ConfigError(
                f"hygiene.phone_region {config.phone_region!r}: not a region libphonenumber knows"
            )
        self.path = str(path)
        self.report = HygieneReport(path=self.path)
        self.index = None
        if config.eval_set is not None:
            # Imported only when needed: datasketch pulls in scipy, seconds of start-up for every run.
            from raygen.hygiene.overlap import EvalIndex

            self.index = EvalIndex.from_file(
                config.eval_set, config.eval_field, config.near_duplicate_threshold
            )
            self.report.eval_set, self.report.eval_rows = str(config.eval_set), self.index.rows
        self.skip_env = set(secret_env)
        self.memo = _ShortTextMemo(config)
        self.rules = default_rules()
        self.unsafe: Counter[str] = Counter()

    def add(self, line: int, row: PromptRow) -> None:
        report = self.report
        report.rows += 1
        before = report.finding_count + report.overlap_count
        for where, text in _row_strings(row, self.skip_env):
            found = scan_text(text, self.config) if where == "prompt" else self.memo.scan(text)
            for category, kind, masked in found:
                report.add_finding(HygieneFinding(self.path, line, where, category, kind, masked))
        if self.index is not None and (match := self.index.match(row.prompt)) is not None:
            report.add_overlap(OverlapFinding(self.path, line, match.kind, match.eval_line, match.similarity))
        report.rows_with_findings += report.finding_count + report.overlap_count > before
        self.unsafe.update({rule.label for rule in self.rules.check("terminal", {"command": row.prompt})})

    def finish(self) -> HygieneReport:
        self.report.unsafe_commands = dict(sorted(self.unsafe.items()))
        return self.report


def scan_hygiene(
    path: str | Path,
    config: HygieneConfig | None = None,
    *,
    limit: int | None = None,
    secret_env: Iterable[str] = (),
) -> HygieneReport:
    """Scan the valid rows of a prompts file (the first ``limit`` of them, if given).

    ``secret_env`` names ``env`` variables whose values are declared secret and therefore not findings.
    """
    scan = HygieneScan(path, config, secret_env)
    for line, row in iter_valid_rows(Path(path), limit):
        scan.add(line, row)
    return scan.finish()
