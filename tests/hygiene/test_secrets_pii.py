"""Secret and personal-data detectors on planted values and near misses."""

from __future__ import annotations

import pytest

from raygen.hygiene.pii import find_cards, find_emails, find_phones, find_pii, luhn_valid, mask_pii
from raygen.hygiene.secrets import find_secrets, mask_secret

# Well-known documentation/test values (AWS's example key, Stripe's test cards), never real credentials.
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END RSA PRIVATE KEY-----"
)
URL_PASSWORD = "Sup3rS3cretPw"


def found(text: str) -> list[tuple[str, str]]:
    return [(h.kind, text[h.start : h.end]) for h in find_secrets(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        (f"use {AWS_KEY} for s3", "AWS Access Key", AWS_KEY),
        (f"git push with {GITHUB_TOKEN} now", "GitHub Token", GITHUB_TOKEN),
        (f"key:\n{PRIVATE_KEY}\n", "Private Key", "BEGIN RSA PRIVATE KEY-----"),
        (f"clone https://alice:{URL_PASSWORD}@git.internal.io/r.git", "Basic Auth Credentials", URL_PASSWORD),
        ("xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx", "Slack Token", None),
        ("OPENAI key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z", "OpenAI API Key", None),
        ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "Hugging Face Token", None),
        ("export DB_PASSWORD=h7Tq9zLm2x", "Secret Assignment", "h7Tq9zLm2x"),
        ('password = "c0rrect-h0rse"', "Secret Keyword", "c0rrect-h0rse"),
    ],
)
def test_planted_secrets_are_found_with_their_kind(text, kind, value):
    hits = found(text)
    assert [k for k, _ in hits] == [kind]
    if value is not None:
        assert hits[0][1] == value


@pytest.mark.parametrize(
    "text",
    [
        "Find all files in /testbed whose md5 sum repeats",
        "def check(password): return password == expected",
        'password = "password"',  # a placeholder, not a secret
        "export API_KEY=$API_KEY",
        "max_tokens=4096 and token_count=12",
        "pip install scikit-learn; sk-learn is a typo",
        "AKIAIOSFODNN7EXAMPL is one character short",
        "https://example.org/path:8080@latest",
        "uuid token_id=123e4567-e89b-12d3-a456-426614174000",
    ],
)
def test_ordinary_text_has_no_secrets(text):
    assert found(text) == []


def test_masks_never_show_the_secret():
    for value in (AWS_KEY, GITHUB_TOKEN, URL_PASSWORD, "hunter2x"):
        masked = mask_secret(value)
        assert "*" in masked and value not in masked
        assert len(masked.rstrip("*")) <= max(0, len(value) // 8)  # at most an eighth is shown
    assert mask_secret(AWS_KEY).startswith("AK") and mask_secret(GITHUB_TOKEN).startswith("ghp_")


@pytest.mark.parametrize(
    ("number", "valid"),
    [
        ("4111111111111111", True),  # Visa test card
        ("5555555555554444", True),  # Mastercard test card
        ("378282246310005", True),  # Amex test card
        ("4111111111111112", False),
        ("79927398713", True),  # the classic Luhn example
        ("79927398710", False),
    ],
)
def test_luhn(number, valid):
    assert luhn_valid(number) is valid


def test_cards_need_a_valid_luhn_digit_and_a_network_prefix():
    text = (
        "valid 4111 1111 1111 1111, dashed 5555-5555-5555-4444, amex 378282246310005; "
        "near misses 4111 1111 1111 1112 and 5555-5555-5555-4445; "
        "Luhn-valid but no network 1234 5678 9012 3452; too long 41111111111111111111"
    )
    cards = [text[h.start : h.end] for h in find_cards(text)]
    assert cards == ["4111 1111 1111 1111", "5555-5555-5555-4444", "378282246310005"]
    assert luhn_valid("1234567890123452")  # so it is the prefix check that drops it


def test_emails_skip_documentation_domains_and_ssh_remotes():
    text = (
        "mail jane.doe@gmail.com or j.smith+tag@mail.co.uk; not bob@example.com, "
        "alice@corp.test, git@github.com:org/repo.git, a..b@x.io, user@localhost"
    )
    emails = [text[h.start : h.end] for h in find_emails(text)]
    assert emails == ["jane.doe@gmail.com", "j.smith+tag@mail.co.uk"]


def test_phones_are_valid_numbers_only():
    text = "call (650) 253-0000 or +44 20 7946 0958; not 555-0100, 2024-01-15, 1,234,567 or 3.14159265"
    assert [text[h.start : h.end] for h in find_phones(text)] == ["(650) 253-0000", "+44 20 7946 0958"]
    # Without a default region only numbers with a country code count.
    assert [text[h.start : h.end] for h in find_phones(text, None)] == ["+44 20 7946 0958"]


def test_a_card_number_is_not_also_reported_as_a_phone():
    text = "card 4111 1111 1111 1111"
    assert [h.kind for h in find_pii(text)] == ["card_number"]


@pytest.mark.parametrize(
    ("kind", "value", "masked"),
    [
        ("email", "jane.doe@gmail.com", "j***@gmail.com"),
        ("phone", "(650) 253-0000", "(***) ***-**00"),
        ("card_number", "4111 1111 1111 1111", "**** **** **** 1111"),
    ],
)
def test_pii_masks(kind, value, masked):
    assert mask_pii(kind, value) == masked
