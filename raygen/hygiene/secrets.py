"""Find secrets in text: API keys, tokens, private keys, credentials in URLs, ``KEY=value`` assignments.

The token formats come from Yelp's ``detect-secrets`` (its regex-based detectors: AWS, GitHub, GitLab,
Slack, Stripe, JWT, private-key headers, ``scheme://user:password@host`` and more, plus its quoted
``password = "..."`` keyword detector). They are called directly (``analyze_string``), not through
``detect_secrets.core.scan``: that path re-reads global settings on every line (about 0.7 ms a line),
applies filters meant for source files, and can *verify* secrets by sending them to the provider,
which a pre-launch check must never do. The entropy detectors are left out: on prompts (code, hashes,
base64 test data) nearly everything they report is noise.

A few formats detect-secrets 1.5 does not know are added here (current OpenAI/Anthropic keys,
Hugging Face and Google API keys, fine-grained GitHub tokens), as is an unquoted
``NAME=value`` assignment whose name says secret and whose value looks random.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.filters import heuristic
from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
from detect_secrets.plugins.keyword import DENYLIST as _KEYWORDS
from detect_secrets.plugins.keyword import KeywordDetector

from raygen.formats.prefilter import Prefilter

# detect-secrets plugins not used, and why: entropy (noise on prompts), public IPs (not a secret).
_SKIPPED_PLUGINS = {"Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector"}
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]*")
_EXTRA_FORMATS: list[tuple[str, re.Pattern[str]]] = [
    ("Anthropic API Key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}")),
    ("OpenAI API Key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")),
    ("Hugging Face Token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("Google API Key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("GitHub Token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}")),
]
_ASSIGNMENT = re.compile(
    r"(?i)\b[\w.\-]*(?:secret|token|passw(?:or)?d|api[_\-]?key|access[_\-]?key|private[_\-]?key|"
    r"credentials?)[\w.\-]*[\"']?\s*[:=]\s*[\"']?([^\s\"',;$<>{}()\[\]`]{6,})"
)
# The keyword detector needs one of its keywords on the line; checking that first skips its costly
# regexes (about 0.3 ms a line) on almost every line.
_KEYWORD_PREFILTER = re.compile("|".join(_KEYWORDS), re.IGNORECASE)
_HAS_LETTER = re.compile(r"[A-Za-z]")
_HAS_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class SecretHit:
    """A secret found in one line of text: its kind and where it is (``text[start:end]``)."""

    kind: str
    start: int
    end: int


@cache
def _detectors() -> tuple[BasePlugin, ...]:
    mapping = get_mapping_from_secret_type_to_class()
    plugins = [cls() for cls in mapping.values() if cls.__name__ not in _SKIPPED_PLUGINS]
    return tuple(p for p in plugins if isinstance(p, RegexBasedDetector | KeywordDetector))


_SCOPED_FLAGS = ((re.I, "i"), (re.M, "m"), (re.S, "s"), (re.X, "x"))


@cache
def _named_prefilter() -> re.Pattern[str]:
    """All named detectors' patterns in one regex: a line it does not match holds none of their
    formats, so the (Python-level) loop over the detectors is skipped for it."""
    parts = []
    for plugin in _detectors():
        for rx in getattr(plugin, "denylist", ()):
            flags = "".join(c for f, c in _SCOPED_FLAGS if rx.flags & f)
            parts.append(f"(?{flags}:{rx.pattern})" if flags else f"(?:{rx.pattern})")
    return re.compile("|".join(parts))


def _looks_random(value: str) -> bool:
    return bool(_HAS_LETTER.search(value) and _HAS_DIGIT.search(value))


def _is_placeholder(value: str) -> bool:
    """detect-secrets' own heuristics for values that are not secrets ($VAR, {{ tpl }}, abcdef, uuid)."""
    return (
        heuristic.is_prefixed_with_dollar_sign(value)
        or heuristic.is_templated_secret(value)
        or heuristic.is_sequential_string(value)
        or heuristic.is_potential_uuid(value)
        or heuristic.is_not_alphanumeric_string(value)
    )


def _spans_of(value: str, line: str) -> Iterator[tuple[int, int]]:
    """Where a detector's value occurs; a value that is a token's prefix (GitHub's ``ghp``) grows to the
    whole token."""
    start = line.find(value)
    while start >= 0:
        end = _TOKEN_CHARS.match(line, start + len(value)).end()  # type: ignore[union-attr]
        yield start, end
        start = line.find(value, end)


def _detector_hits(line: str, keyword: bool) -> Iterator[SecretHit]:
    prefilter = _KEYWORD_PREFILTER if keyword else _named_prefilter()
    if not prefilter.search(line):
        return
    for plugin in _detectors():
        if isinstance(plugin, KeywordDetector) != keyword:
            continue
        for value in sorted(set(plugin.analyze_string(line))):
            if not value or (keyword and (_is_placeholder(value) or not _looks_random(value))):
                continue
            for start, end in _spans_of(value, line):
                yield SecretHit(plugin.secret_type, start, end)


def _candidates(line: str) -> Iterator[SecretHit]:
    """Hits in priority order: named token formats, then ``password = "..."``, then ``NAME=value``."""
    yield from _detector_hits(line, keyword=False)
    for kind, pattern in _EXTRA_FORMATS:
        for m in pattern.finditer(line):
            if _looks_random(m.group(0)):
                yield SecretHit(kind, m.start(), m.end())
    yield from _detector_hits(line, keyword=True)
    for m in _ASSIGNMENT.finditer(line):
        value = m.group(1)
        if _looks_random(value) and not _is_placeholder(value):
            yield SecretHit("Secret Assignment", m.start(1), m.end(1))


@cache
def _gate() -> Prefilter:
    """Every pattern a secret is found by, as one gate: a text it lets through may hold a secret."""
    named = [rx for plugin in _detectors() for rx in getattr(plugin, "denylist", ())]
    return Prefilter([*named, _KEYWORD_PREFILTER, *(rx for _, rx in _EXTRA_FORMATS), _ASSIGNMENT])


def find_secrets(text: str) -> list[SecretHit]:
    """Every secret in ``text`` (searched line by line), positions relative to ``text``; overlapping
    hits are reported once, under the most specific kind."""
    if not _gate().might_match(text):  # nearly every prompt: one linear scan instead of ~50 per line
        return []
    hits: list[SecretHit] = []
    offset = 0
    for line in text.splitlines(keepends=True):
        taken: list[tuple[int, int]] = []
        for hit in _candidates(line):
            if any(hit.start < end and start < hit.end for start, end in taken):
                continue
            taken.append((hit.start, hit.end))
            hits.append(SecretHit(hit.kind, hit.start + offset, hit.end + offset))
        offset += len(line)
    return sorted(hits, key=lambda h: h.start)


def mask_secret(value: str) -> str:
    """A secret as it may be shown: at most its first 4 characters (an eighth of it, so none of a short
    password; 4 is the non-secret type prefix of most tokens, e.g. ``AKIA``, ``ghp_``), the rest as ``*``."""
    keep = min(4, len(value) // 8)
    return value[:keep] + "*" * max(4, min(len(value) - keep, 16))
