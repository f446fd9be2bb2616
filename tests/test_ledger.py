"""``Ledger.reopen`` (``--retry-failed``): which samples run again, and for how many attempts."""

from __future__ import annotations

from raygen.run.ledger import Ledger


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


def test_the_next_pass_is_planned_from_the_last_passs_files(tmp_path):
    # Each pass after the first reads the previous pass's chunk files, not the dataset: only the samples
    # with an attempt left come back, as that attempt, and the new files live beside the old ones.
    from raygen.distributed.pipeline import write_pending
    from raygen.input.rows import PromptRow, Sample

    samples = [
        Sample(row=PromptRow(prompt=f"p{i}"), sample_key=f"k{i}", prompt_index=i, line=i + 1, toolsets=[])
        for i in range(5)
    ]
    first, _ = write_pending(samples, tmp_path, 2, name="pass1")
    led = Ledger()
    led.record("k0", 1, "completed")
    led.record("k1", 1, "error:provider_unavailable")  # retryable
    led.record("k2", 1, "error:provider_auth")  # final
    led.record("k3", 1, "error:worker_lost")  # retryable
    # k4 never came back (no record yet): it runs again as attempt 1
    second, count = write_pending(led.still_pending(first, 3), tmp_path, 2, name="pass2")
    again = [Sample.model_validate_json(line) for f in second for line in f.read_text().splitlines()]
    assert count == 3 and [(s.sample_key, s.attempt) for s in again] == [("k1", 2), ("k3", 2), ("k4", 1)]
    assert all(f.exists() for f in first)  # a pass never overwrites the files it is planned from
