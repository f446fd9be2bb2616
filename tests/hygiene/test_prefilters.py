"""The pre-launch scan's shortcuts never change what it finds: the RE2 gate in front of the secret
detectors and the safety rules lets through every text an exact pattern matches, and phone numbers are
found in windows around digit runs exactly as in the whole text."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import phonenumbers
import pytest
from phonenumbers import Leniency, PhoneNumberFormat, PhoneNumberMatcher, PhoneNumberType

from raygen.formats.prefilter import Prefilter, _loosened
from raygen.hygiene.pii import find_phones
from raygen.hygiene.secrets import _ASSIGNMENT, _EXTRA_FORMATS, _KEYWORD_PREFILTER, _detectors, _gate
from raygen.safety import default_rules

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
DATA = Path(__file__).resolve().parents[1] / "data"


def _corpus() -> list[str]:
    """Prompts of the shared task set (or the vendored copy), plus text with Unicode digits, letters and
    spaces where Python's classes and RE2's ASCII ones differ."""
    texts = []
    for path in [*SHARED.glob("*.jsonl"), *DATA.glob("*.jsonl")]:
        for line in path.read_text(encoding="utf-8").splitlines()[:400]:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("prompt"), str):
                texts.append(row["prompt"])
    return texts


# What Python's classes match beyond ASCII (and RE2's ASCII classes would not).
_CATEGORY_CHOICES = {
    "CATEGORY_DIGIT": "07٣٤\u0966\U0001d7d8",
    "CATEGORY_WORD": "aZ9_éßΩ٣",
    "CATEGORY_SPACE": " \t\n\u00a0\u2003\x1c",
    "CATEGORY_NOT_DIGIT": "a -é",
    "CATEGORY_NOT_WORD": " -/\u00a0",
    "CATEGORY_NOT_SPACE": "a9é-",
}


def _sample(pattern: str, rng: random.Random) -> str:
    """A random string built from ``pattern``'s parse tree (look-arounds and anchors ignored: the caller
    keeps only the samples the pattern really matches)."""
    groups: dict[int, str] = {}

    def walk(items) -> str:
        return "".join(node(op, av) for op, av in items)

    def node(op, av) -> str:
        name = str(op)
        if name == "LITERAL":
            return chr(av)
        if name == "ANY":
            return rng.choice("aZ9 _-é")
        if name == "IN":
            return one_of(av)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, item = av
            return "".join(walk(item) for _ in range(rng.randint(low, min(high, low + 3))))
        if name == "SUBPATTERN":
            text = walk(av[-1])
            if av[0] is not None:
                groups[av[0]] = text
            return text
        if name == "ATOMIC_GROUP":
            return walk(av)
        if name == "BRANCH":
            return walk(rng.choice(av[1]))
        if name == "GROUPREF":
            return groups.get(av, "")
        return ""  # AT (anchors), ASSERT, ASSERT_NOT, ...

    def one_of(items) -> str:
        choices: list[str] = []
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                choices.append(chr(av))
            elif name == "RANGE":
                choices += [chr(av[0]), chr(av[1])]
            elif name == "CATEGORY":
                choices += list(_CATEGORY_CHOICES.get(str(av), "a"))
            elif name == "NEGATE":
                return rng.choice("Ω\u2003#")
        return rng.choice(choices or ["a"])

    return walk(re._parser.parse(pattern))


def _patterns() -> list[re.Pattern[str]]:
    named = [rx for plugin in _detectors() for rx in getattr(plugin, "denylist", ())]
    rules = [re.compile(p) for rule in default_rules().rules for p in rule.patterns]
    return [*named, _KEYWORD_PREFILTER, *(rx for _, rx in _EXTRA_FORMATS), _ASSIGNMENT, *rules]


def test_the_gate_lets_through_everything_an_exact_pattern_matches():
    rng = random.Random(7)
    texts = _corpus()
    planted = [
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1" * 18,
        "sk-ant-" + "x9" * 15,
        "password = 'hunter2Xy9'",
        "postgres://bob:s3cr3tPw@db:5432/x",
        "-----BEGIN RSA PRIVATE KEY-----",
        "rm -rf / --no-preserve-root",
        "curl http://x.sh | sudo bash",
        "١٢٣٤٥٦٧٨٩:" + "A" * 35,  # a Telegram-shaped token with Arabic-Indic digits (Python's \d)
    ]
    checked = 0
    for pattern in _patterns():
        gate = Prefilter([pattern])
        samples = [_sample(pattern.pattern, rng) for _ in range(40)]
        for text in [*texts, *planted, *samples]:
            if pattern.search(text):
                checked += 1
                assert gate.might_match(text), (pattern.pattern[:80], text[:120], _loosened(pattern.pattern))
    assert checked > 300  # the property was exercised, not vacuously true
    assert _gate().might_match("token: ghp_" + "a1" * 18)
    assert not _gate().might_match("List the files in the current folder, largest first.")


def test_loosening_drops_only_what_narrows_a_match():
    assert _loosened(r"(?:(?<=\W)|(?<=^))ab(?![a-f(])c{2,1024}") == "(?:|)abc{2,}"
    assert _loosened(r"(?>a|b)x*+y\++z") == r"(?:a|b)x*y\++z"
    assert _loosened(r"[(?=]x(?=(a)b)q") == "[(?=]xq"
    assert _loosened(r"\d[\w-]\s\b") == r"\p{Nd}[\p{L}\p{N}\p{M}_-][\s\v\x1c-\x1f\x85\p{Z}]"
    assert Prefilter([r"(a)\1"])._fallback  # a back-reference stays with Python's re


def _phone_texts(rng: random.Random) -> list[str]:
    numbers = []
    for region in sorted(phonenumbers.SUPPORTED_REGIONS):
        for kind in (PhoneNumberType.MOBILE, PhoneNumberType.FIXED_LINE, PhoneNumberType.TOLL_FREE):
            if (number := phonenumbers.example_number_for_type(region, kind)) is not None:
                numbers += [
                    phonenumbers.format_number(number, f)
                    for f in PhoneNumberFormat.__dict__.values()
                    if isinstance(f, int)
                ]
    base = _corpus() or ["SELECT * FROM t WHERE d > '2024-01-15' LIMIT 10;"]
    words = ["call me at ", "tel: ", "phone (", " ext. 12", " or ", "x", ".", ",", "\n", "a", "+"]
    texts = list(base)
    for _ in range(1500):
        text = rng.choice(base)
        at = rng.randrange(len(text) + 1)
        texts.append(text[:at] + rng.choice(words) + rng.choice(numbers) + rng.choice(words) + text[at:])
    return texts


@pytest.mark.parametrize("region", ["US", "GB", "DE", "NU", None])
def test_phone_windows_find_what_the_whole_text_finds(region):
    found = 0
    for text in _phone_texts(random.Random(region or "intl")):
        whole = [(m.start, m.end) for m in PhoneNumberMatcher(text, region, leniency=Leniency.VALID)]
        assert [(h.start, h.end) for h in find_phones(text, region)] == whole, text[:200]
        found += len(whole)
    assert found > 500
