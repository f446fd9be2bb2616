"""Reading a provider's rate-limit headers: reset durations, epoch timestamps, exhausted windows."""

from __future__ import annotations

import pytest

from raygen.distributed.provider_headers import parse_reset, pause_from_headers


@pytest.mark.parametrize(
    ("value", "expected"),
    [("6m0s", 360.0), ("1.5s", 1.5), ("20ms", 0.02), ("1h2m3s", 3723.0), ("7", 7.0), ("bogus", None)],
)
def test_parse_reset_durations(value, expected):
    assert parse_reset(value, wall_now=0) == expected


def test_parse_reset_epoch_timestamps():
    assert parse_reset("1700000012", wall_now=1_700_000_000) == pytest.approx(12)
    assert parse_reset("1700000012500", wall_now=1_700_000_000) == pytest.approx(12.5)


def test_pause_from_headers_only_when_a_window_is_exhausted():
    assert pause_from_headers(None) == 0.0
    headers = {"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "2s"}
    assert pause_from_headers(headers) == pytest.approx(2.0)
    assert pause_from_headers({**headers, "X-RateLimit-Remaining-Requests": "12"}) == 0.0
    openrouter = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000003000"}
    assert pause_from_headers(openrouter, wall_now=1_700_000_000) == pytest.approx(3.0)


def test_anthropic_headers_with_rfc3339_resets():
    now = 1_700_000_000  # 2023-11-14T22:13:20Z
    assert parse_reset("2023-11-14T22:13:25Z", wall_now=now) == pytest.approx(5.0)
    assert parse_reset("2023-11-14T22:13:25.500+00:00", wall_now=now) == pytest.approx(5.5)
    assert parse_reset("2023-11-14T22:13:25", wall_now=now) is None  # no zone: no certain time
    anthropic = {
        "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:13:27Z",
    }
    assert pause_from_headers(anthropic, wall_now=now) == pytest.approx(7.0)  # the exhausted window's


def test_retry_after_forms_the_model_client_reads():
    from raygen.model.openai_model import _retry_after

    assert _retry_after({"retry-after-ms": "1500", "retry-after": "2"}) == pytest.approx(1.5)
    assert _retry_after({"retry-after": "2"}) == pytest.approx(2.0)
    assert _retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
