"""``Ledger.reopen`` (``--retry-failed``): which samples run again, and for how many attempts."""

from __future__ import annotations

from raygen.ledger import Ledger


def ledger() -> Ledger:
    led = Ledger()
    led.record("auth", 1, "error:provider_auth")
    led.record("bad", 1, "error:provider_bad_request")
    led.record("kept", 1, "completed")
    led.record("limited", 3, "error:rate_limited")  # retryable, but out of attempts
    return led


def test_only_the_named_kinds_are_reopened():
    led = ledger()
    assert [led.next_attempt(k, 3) for k in ("auth", "bad", "kept", "limited")] == [None] * 4
    assert led.reopen(["provider_auth", "rate_limited"], max_attempts=3) == 2
    assert [led.next_attempt(k, 3) for k in ("auth", "bad", "kept", "limited")] == [2, None, None, 4]


def test_a_reopened_sample_is_judged_as_usual_after_its_next_failure():
    led = ledger()
    led.reopen(["provider_auth"], max_attempts=3)
    led.record("auth", 2, "error:provider_unavailable")  # retryable: goes on
    assert led.next_attempt("auth", 3) == 3
    led.record("auth", 3, "error:provider_auth")  # final again: done, no loop
    assert led.next_attempt("auth", 3) is None
    led.reopen(["rate_limited"], max_attempts=2)
    for attempt in (4, 5):
        assert led.next_attempt("limited", 3) == attempt
        led.record("limited", attempt, "error:rate_limited")
    assert led.next_attempt("limited", 3) is None  # its max_attempts new attempts are used up


def test_success_after_reopening_is_final():
    led = ledger()
    led.reopen(["provider_bad_request"], max_attempts=3)
    led.record("bad", 2, "completed")
    assert led.next_attempt("bad", 3) is None
