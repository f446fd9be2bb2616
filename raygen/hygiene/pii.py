"""Find personal data in text: email addresses, phone numbers, payment card numbers.

- Phone numbers: Google's libphonenumber (the ``phonenumbers`` port) with ``Leniency.VALID``: a number
  must be a real, assigned-format number for its region, which regexes cannot tell. On the shared
  agent-tasks prompts (code, dates, SQL, shell) it reports none with region US.
- Email addresses: a strict regex (RFC 5321 lengths, no leading/trailing/double dots); addresses at the
  domains reserved for documentation (RFC 2606/6761: ``example.com``, ``*.test``, ...) are not personal
  data and are skipped, as is ``git@host:path`` (an SSH remote, not a mailbox).
- Card numbers: 13-19 digits, optionally grouped by spaces or dashes, with a known network's prefix
  (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay) and a valid Luhn check digit; the prefix
  and Luhn checks together drop all but a few percent of random digit runs of those lengths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import phonenumbers
from phonenumbers import Leniency, PhoneMetadata, PhoneNumberMatcher

EMAIL = re.compile(
    r"(?<![\w.%+\-])([A-Za-z0-9][A-Za-z0-9._%+\-]{0,63})@"
    r"((?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24})(?![\w\-])"
)
_RESERVED_DOMAINS = ("example.com", "example.net", "example.org")
_RESERVED_TLDS = ("example", "test", "invalid", "localhost", "local")
_CARD = re.compile(r"(?<![\d\-])\d(?:[ \-]?\d){12,18}(?![\d])")
_CARD_PREFIXES = re.compile(
    r"^(?:4\d{12}(?:\d{3}){0,2}"  # Visa: 13, 16, 19
    r"|(?:5[1-5]\d{2}|222[1-9]|22[3-9]\d|2[3-6]\d{2}|27[01]\d|2720)\d{12}"  # Mastercard: 16
    r"|3[47]\d{13}"  # American Express: 15
    r"|(?:6011|64[4-9]\d|65\d{2})\d{12,15}"  # Discover: 16-19
    r"|35(?:2[89]|[3-8]\d)\d{12,15}"  # JCB: 16-19
    r"|3(?:0[0-5]|[689]\d)\d{11,16}"  # Diners Club: 14-19
    r"|62\d{14,17})$"  # UnionPay: 16-19
)


@dataclass(frozen=True)
class PiiHit:
    """Personal data found in text: its kind and where it is (``text[start:end]``)."""

    kind: str
    start: int
    end: int


def _reserved(domain: str) -> bool:
    domain = domain.lower()
    return domain.rsplit(".", 1)[-1] in _RESERVED_TLDS or any(
        domain == d or domain.endswith("." + d) for d in _RESERVED_DOMAINS
    )


def find_emails(text: str) -> list[PiiHit]:
    """Email addresses, except reserved documentation domains and ``git@host:path`` remotes."""
    hits = []
    for m in EMAIL.finditer(text):
        local, domain = m.group(1), m.group(2)
        if ".." in local or local.endswith(".") or _reserved(domain) or text[m.end() : m.end() + 1] == ":":
            continue
        hits.append(PiiHit("email", m.start(), m.end()))
    return hits


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check that every payment card number passes."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def find_cards(text: str) -> list[PiiHit]:
    """Payment card numbers: a known network prefix, 13-19 digits, valid Luhn digit."""
    hits = []
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if _CARD_PREFIXES.match(digits) and luhn_valid(digits):
            hits.append(PiiHit("card_number", m.start(), m.end()))
    return hits


# libphonenumber's matcher costs ~0.1 ms per string even on text without a digit, and prompts are mostly
# code, so it runs only on windows around digit runs long enough to hold a valid number (with context on
# both sides: what the matcher sees around a number, a leading "+" or a letter that rules a match out, is
# what it would see in the whole text). tests/hygiene/test_secrets_pii.py checks that the windows find
# what the whole text finds.
_DIGIT_RUN = re.compile(r"\d(?:[^\S\n]{0,3}[\-./()\u2010-\u2015\uff0d]{0,2}[^\S\n]{0,3}\d)+")
_WINDOW_CONTEXT = 40


@cache
def _min_digits(region: str | None) -> int:
    """The fewest digits a valid number can have: an international one (country code + the shortest
    national number of any region), or a national one of ``region``."""
    shortest = min(
        len(str(meta.country_code)) + min(lengths)
        for meta in map(PhoneMetadata.metadata_for_region, phonenumbers.SUPPORTED_REGIONS)
        if meta is not None and (lengths := [n for n in meta.general_desc.possible_length if n > 0])
    )
    meta = PhoneMetadata.metadata_for_region(region.upper()) if region else None
    if meta is not None:
        shortest = min(shortest, min(n for n in meta.general_desc.possible_length if n > 0))
    return shortest


def _phone_windows(text: str, region: str | None) -> list[tuple[int, int]]:
    """Spans of ``text`` that may hold a phone number, merged where they touch."""
    windows: list[tuple[int, int]] = []
    fewest = _min_digits(region)
    for m in _DIGIT_RUN.finditer(text):
        if sum(c.isdigit() for c in m.group(0)) < fewest:
            continue
        start, end = max(0, m.start() - _WINDOW_CONTEXT), min(len(text), m.end() + _WINDOW_CONTEXT)
        if windows and start <= windows[-1][1]:
            windows[-1] = (windows[-1][0], end)
        else:
            windows.append((start, end))
    return windows


def find_phones(text: str, region: str | None = "US") -> list[PiiHit]:
    """Valid phone numbers (libphonenumber); ``region`` reads numbers without a country code."""
    hits = []
    for start, end in _phone_windows(text, region):
        for match in PhoneNumberMatcher(text[start:end], region, leniency=Leniency.VALID):
            hits.append(PiiHit("phone", start + match.start, start + match.end))
    return hits


def find_pii(text: str, region: str | None = "US") -> list[PiiHit]:
    """All personal data in ``text``; a span found as a card number is not reported again as a phone."""
    hits = find_cards(text) + find_emails(text)
    for phone in find_phones(text, region):
        if not any(phone.start < h.end and h.start < phone.end for h in hits):
            hits.append(phone)
    return sorted(hits, key=lambda h: h.start)


def mask_pii(kind: str, value: str) -> str:
    """A value as it may be shown: ``j***@gmail.com``; phones and cards keep only their last digits."""
    if kind == "email":
        local, _, domain = value.partition("@")
        return f"{local[:1]}***@{domain}"
    keep = 4 if kind == "card_number" else 2
    digits_seen = 0
    out = []
    total = sum(c.isdigit() for c in value)
    for c in value:
        if c.isdigit():
            digits_seen += 1
            out.append(c if digits_seen > total - keep else "*")
        else:
            out.append(c)
    return "".join(out)


def phone_region_valid(region: str | None) -> bool:
    """Whether libphonenumber knows ``region`` (None is fine: international numbers only)."""
    return region is None or region.upper() in phonenumbers.SUPPORTED_REGIONS
