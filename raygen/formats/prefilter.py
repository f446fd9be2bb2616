r"""A linear-time gate in front of many regular expressions: ``Prefilter(patterns).might_match(text)`` is
False only when no pattern can match anywhere in ``text``.

Why: the pre-launch scans (secrets, unsafe commands in prompts) hold ~50 patterns; Python's ``re`` tries
an alternation of them at every position (~0.6 us a character), which made the scan of 20,000 prompts
take seconds. RE2 (``google-re2``) runs the whole alternation as one automaton, ~10x faster on prompts.
Nearly every prompt matches none, so the exact (Python) detectors run only on the few that might.

RE2 has no look-around, bounds repetition at 1000 and reads ``\d``, ``\w``, ``\s`` and ``\b`` as ASCII, so
each pattern is loosened into one that matches *at least* what the original does: look-behinds, negative
look-aheads and word boundaries dropped, ``{n,m}`` with a huge ``m`` widened to ``{n,}``, the classes
spelled as the Unicode categories Python's ``re`` means by them; a pattern still outside RE2 (verbose
ones, back-references) is searched with ``re``. A gate may let a text
through that the exact detectors then clear; it never stops one they would flag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import re2

_HUGE_REPEAT = re.compile(r"\{(\d+),(\d{4,})\}")
_FLAGS = ((re.I, "i"), (re.M, "m"), (re.S, "s"))


# Python's str classes as Unicode categories (a superset: \w adds marks), inside a [...] and outside one.
_CLASSES = {
    "d": ("\\p{Nd}", "\\p{Nd}"),
    "w": ("\\p{L}\\p{N}\\p{M}_", "[\\p{L}\\p{N}\\p{M}_]"),
    "s": ("\\s\\v\\x1c-\\x1f\\x85\\p{Z}", "[\\s\\v\\x1c-\\x1f\\x85\\p{Z}]"),
    "b": ("\\x08", ""),  # inside a class, \b is a backspace
    "B": ("", ""),
}


def _unicode_classes(pattern: str) -> str:
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            if escaped == "u":  # \uXXXX is RE2's \x{XXXX}
                out.append("\\x{" + pattern[i + 2 : i + 6] + "}")
                i += 6
                continue
            out.append(_CLASSES[escaped][0 if in_class else 1] if escaped in _CLASSES else char + escaped)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            out.append(char)
            i += 1
            for lead in ("^", "]"):  # "[]..." and "[^]..." hold a literal "]"
                if pattern.startswith(lead, i):
                    out.append(lead)
                    i += 1
            continue
        if char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _group_end(pattern: str, start: int) -> int:
    """The index after the ``)`` closing the group that opens at ``pattern[start]``."""
    depth, in_class, i = 0, False, start
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 1 + pattern.startswith("]", i + 1) + pattern.startswith("^]", i + 1)
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(pattern)


def _without_assertions(pattern: str) -> str:
    """Look-arounds dropped (each only narrows a match), atomic groups and possessive quantifiers made
    plain (a plain one matches whatever they match)."""
    out: list[str] = []
    in_class, i = False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            i = _group_end(pattern, i)
            continue
        elif pattern.startswith("(?>", i):
            out.append("(?:")
            i += 3
            continue
        elif char == "+" and out and out[-1] in ("*", "+", "?", "}"):
            i += 1  # possessive
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _loosened(pattern: str) -> str:
    """``pattern`` with what RE2 lacks replaced by something that matches as much or more."""
    return _unicode_classes(_HUGE_REPEAT.sub(r"{\1,}", _without_assertions(pattern)))


def _scoped(rx: re.Pattern[str], pattern: str) -> str:
    flags = "".join(c for f, c in _FLAGS if rx.flags & f)
    return f"(?{flags}:{pattern})" if flags else f"(?:{pattern})"


class Prefilter:
    """One RE2 automaton for every pattern it can hold, plus ``re`` for the rest."""

    def __init__(self, patterns: Iterable[re.Pattern[str] | str]):
        options = re2.Options()
        options.log_errors = False  # a pattern RE2 refuses goes to the fallback list, not to stderr
        parts: list[str] = []
        self._fallback: list[re.Pattern[str]] = []
        for pattern in patterns:
            rx = re.compile(pattern) if isinstance(pattern, str) else pattern
            if rx.flags & re.VERBOSE or isinstance(rx.pattern, bytes):
                self._fallback.append(rx)
                continue
            part = _scoped(rx, _loosened(rx.pattern))
            try:
                re2.compile(part, options)
            except re2.error:
                self._fallback.append(rx)
            else:
                parts.append(part)
        self._automaton = re2.compile("|".join(parts), options) if parts else None

    def might_match(self, text: str) -> bool:
        if self._automaton is not None and self._automaton.search(text):
            return True
        return any(rx.search(text) for rx in self._fallback)
