"""Learning an unknown rate limit: the arithmetic of the governor's adaptive target (pure functions).

``GovernorPolicy`` (raygen.distributed.governor_policy) owns the state and calls these: a cut sets the
target to the rate the provider let through (``measured_rpm``, then ``cut_target``); clean, busy traffic
grows it again (``grown_target``): doubling far below the measured limit (slow start), additively near it
(AIMD), slowly past it.
"""

from __future__ import annotations

from raygen.config import GovernorConfig

MIN_RPM = 1.0
"""The adaptive target never drops below this (requests per minute)."""
SLOW_START = 2.0
"""Growth multiplier per interval while the target is far below the measured limit (or none is known)."""
NEAR_LAST_LIMIT = 0.9
"""Below this share of the measured limit, the target grows fast."""
FORGET_LAST_LIMIT = 1.5
"""Above this multiple of the measured limit without a 429, the old limit is forgotten."""
SAME_LIMIT = 0.1
"""Two cuts measured "the same limit" when the rates differ by at most this share."""
MAX_PROBE_HALVINGS = 3
"""Probing past a limit measured alike in several cuts in a row slows down to 1/2**this of its pace."""
BUSY_SHARE = 0.8
"""The target only grows when at least this share of it was used during the last interval."""
MIN_STEP_REQUESTS = 3
"""An increase interval spans at least this many requests' worth of the target, so that "busy" is judged on
more than one request at low rates."""
KNOWN_TRIM = 0.015
"""A 429 under a known ``rpm`` (adaptive off) lowers the pace by this share of it: the provider counts
more strictly than the pacing allows for (a one-second sliding window with network jitter)."""
KNOWN_FLOOR = 0.9
"""... but never below this share of the configured pace."""
MIN_MEASURE_S = 1.0
"""The measured rate divides by at least this span (passed time plus Retry-After): no provider counts over
less than a second, and a token bucket's stored burst must not read as a rate."""
SETTLE_S = 0.3
"""After the first 429 of an unpaced run, nothing is granted for this long (or the Retry-After, if longer)
so that the answers to everything already sent arrive before the rate is measured."""


def measured_rpm(passed: float, span_s: float, pause_s: float) -> float:
    """A provider that let ``passed`` requests through over ``span_s`` seconds and then asks for
    ``pause_s`` more allows about ``passed`` per (span + pause), whichever way it counts."""
    return max(1.0, passed) * 60.0 / max(MIN_MEASURE_S, max(0.0, span_s) + max(0.0, pause_s))


def known_trim(target_rpm: float, ceiling_rpm: float) -> float:
    """The pace of a known limit after a confirmed 429: 1.5% of it slower, never below 90%."""
    return max(KNOWN_FLOOR * ceiling_rpm, target_rpm - KNOWN_TRIM * ceiling_rpm)


def cut_target(
    measured: float, target_rpm: float, last_limit: float | None, config: GovernorConfig
) -> tuple[float, float]:
    """(new target, limit to remember) after a cut that measured ``measured`` rpm while pacing at
    ``target_rpm``; ``last_limit`` is the limit measured by the cut before, if any."""
    target = measured * config.headroom
    if target >= target_rpm:
        # Sent at the target, refused, yet measured at or above it: the figure is inflated (a burst the
        # provider had stored, a window longer than ours), so fall back to a plain cut.
        return target_rpm * config.decrease_factor, min(measured, target_rpm)
    if last_limit is None:
        # Slow start overshot: the rate before the last doubling passed, and the measured figure spans
        # the whole climb, so it reads low.
        return max(target, target_rpm / SLOW_START), measured
    # Near a known limit, no deeper than a plain cut in one step: right after an overshoot a sliding
    # window lets through only what expires, less than it allows on average. A further 429 cuts again.
    return max(target, target_rpm * config.decrease_factor), measured


def same_limit(measured: float, last_limit: float | None) -> bool:
    """Whether a cut measured about the limit the previous cut did."""
    return last_limit is not None and abs(measured - last_limit) <= SAME_LIMIT * last_limit


def grown_target(
    target_rpm: float, last_limit: float | None, confirmed: int, config: GovernorConfig
) -> float:
    """The target after a clean, busy interval: doubling while far below the measured limit or before
    any 429 (slow start), else by ``increase_fraction`` of the measured limit (additive increase)."""
    if last_limit is None:
        return target_rpm * SLOW_START
    if target_rpm < NEAR_LAST_LIMIT * last_limit:
        # Recover quickly, but approach the rate that last drew a 429 in small steps.
        return min(target_rpm * SLOW_START, NEAR_LAST_LIMIT * last_limit)
    # A limit measured alike twice: go up to its headroom share (a token bucket refuses any pace above
    # its refill rate, so sitting at the measured figure itself, which reads a little high, drew a 429
    # every few seconds: 2.2% of requests at 1,200 rpm), then probe past it slowly.
    ceiling = last_limit * config.headroom if confirmed else last_limit
    if target_rpm < ceiling:
        target = target_rpm + config.increase_fraction * last_limit
        return min(target, ceiling) if confirmed else target
    # Past the measured limit a window provider answers late (a sliding window of 10 s only refuses once
    # it is full), so probe a third as fast; and half as fast again for each cut in a row that measured
    # the same limit: every probe past a fixed limit costs 429s.
    step = config.increase_fraction * last_limit / 3
    return target_rpm + step / 2 ** min(confirmed, MAX_PROBE_HALVINGS)


def increase_interval_s(target_rpm: float | None, config: GovernorConfig) -> float:
    """Seconds of clean traffic between two increases: at least three requests' worth of the target."""
    if target_rpm is None:
        return config.increase_interval_s
    return max(config.increase_interval_s, MIN_STEP_REQUESTS * 60.0 / target_rpm)
