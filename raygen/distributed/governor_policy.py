"""The arithmetic of the cluster-wide rate governor: pure Python, no Ray, no asyncio, injectable clock.

``GovernorPolicy`` holds the state of one governor (raygen.distributed.governor wraps it in a Ray actor):

- two token buckets (requests, tokens) refilled at the current target rate, holding at most ``burst_s``
  seconds' worth, so a minute's budget never goes out at once;
- a cluster-wide in-flight count (leased slots not yet returned or completed);
- learning an unknown limit (raygen.distributed.rate_learning): with no ``rpm`` nothing is paced until
  the provider refuses; 429s that are evidence (raygen.distributed.refusals: not a lone one) set the
  target to the rate the provider let through, once per ``cut_window_s`` and only for requests admitted
  since the last cut, so one burst of 429s cuts once; clean, busy traffic then grows the target;
- a global pause only when several refusals came close together, for the median of what they asked.

Workers take *leases* and send back ``UsageReport`` deltas (raygen.distributed.leases).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from raygen.config import GovernorConfig
from raygen.distributed import rate_learning as learning
from raygen.distributed.leases import Holders, Lease, UsageReport
from raygen.distributed.rate_meters import (
    RATE_WINDOW_S,
    Bucket,
    History,
    RateWindow,
    grantable,
    most_grantable,
    wait_hint,
)
from raygen.distributed.refusals import Refusal, RefusalEvidence, allowed_again_at

MIN_RPM = learning.MIN_RPM
_HOLDER_TIMEOUT_S = 60.0
"""A worker silent for this long is presumed dead and its reserved slots are freed."""


class GovernorPolicy:
    """All governor decisions for one (endpoint, model, key). Not thread-safe; the actor serialises calls."""

    def __init__(
        self,
        config: GovernorConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        history_len: int = 600,
        holder_timeout_s: float = _HOLDER_TIMEOUT_S,
    ):
        self.config = config
        self._clock = clock
        self.adaptive = config.resolved_adaptive()
        now = clock()
        self._start = now
        # Known limits are paced to with a little headroom (see GovernorConfig.headroom); the adaptive
        # bounds are not provider limits, so they are used as given.
        known_rpm = None if config.rpm is None else config.rpm * config.headroom
        self.tpm_ceiling = None if config.tpm is None else config.tpm * config.headroom
        self.ceiling_rpm: float | None = None
        self.target_rpm: float | None = None
        if known_rpm is not None:
            self.ceiling_rpm = self.target_rpm = known_rpm
        elif self.adaptive:
            # No initial rate: unpaced (no request bucket) until the first cut sets one.
            self.ceiling_rpm, self.target_rpm = config.max_rpm, config.initial_rpm
        self.target_tpm = self.tpm_ceiling
        self._requests = self._make_bucket(self.target_rpm, now)
        self._tokens = self._make_bucket(self.target_tpm, now)
        self._holders = Holders(holder_timeout_s)
        self.refusals = RefusalEvidence()
        self.epoch = 0
        self.paused_until = now
        self._last_cut = -math.inf
        self.measured_limit_rpm: float | None = None
        """The rate the provider let through when its last 429s came (None before any)."""
        self._confirmed = 0  # cuts in a row that measured about the same limit as the one before
        self._first_grant: float | None = None
        self._settling: float | None = None  # after the first cut: when the provider allows again
        self._pacing_since = -math.inf  # when the current target was set by a cut
        self._start_step(now)
        self._admitted = RateWindow()
        self._passed = RateWindow()  # admitted minus returned minus answered 429
        self._token_use = RateWindow()
        self._next_reap = now
        self.totals: dict[str, float] = dict.fromkeys(
            ("granted", "returned", "completed", "rate_limited", "errors", "cuts", "pauses", "leases"), 0
        )
        self.totals.update(wait_s=0.0, tokens=0)
        self._history = History(max_len=history_len, next_at=now)

    @property
    def reserved(self) -> int:
        """Slots leased and not yet completed or returned, over all workers."""
        return self._holders.reserved

    # ---------------------------------------------------------------- public API

    def lease(
        self, holder: str, want_requests: int, want_tokens: float = 0.0, min_requests: int = 1
    ) -> Lease:
        """Grant up to ``want_requests`` slots (for about ``want_tokens`` tokens in total) now, or nothing
        if fewer than ``min_requests`` (clamped to what the buckets can ever hold) are available."""
        now = self._advance()
        state = self._holders.touch(holder, now)
        if want_requests <= 0:
            return self._lease_reply(0, 0.0, now)
        per_request = max(0.0, want_tokens) / want_requests
        if now < self.paused_until:
            return self._lease_reply(0, per_request, now, wait_hint_s=self.paused_until - now)
        if self._first_grant is None and self.config.rpm is not None and self._requests is not None:
            # A known limit starts with one request, not a full burst (the bucket has filled while the
            # workers started): the first second then holds the paced rate plus one, which a 1-s window
            # allows at 97%. Rate plus burst (~22 at 1,200 rpm) drew 429s from a sliding 1-s window
            # within the first two seconds, and with them two trims (97% -> 93%) for the whole run.
            self._requests.level = min(self._requests.level, 1.0)
        available = self._available(want_requests, per_request)
        floor = max(1, min(min_requests, want_requests, self._max_grantable(per_request)))
        if available < floor:
            return self._lease_reply(0, per_request, now, wait_hint_s=self._wait_hint(floor, per_request))
        granted = min(want_requests, available)
        if self._requests is not None:
            self._requests.level -= granted
        if self._tokens is not None:
            self._tokens.level -= granted * per_request
        self._holders.grant(state, granted)
        self._admitted.add(now, granted)
        self._passed.add(now, granted)
        if self._first_grant is None:
            self._first_grant = now
        self._step_admitted += granted
        self._step_tokens += granted * per_request
        self.totals["granted"] += granted
        self.totals["leases"] += 1
        return self._lease_reply(granted, per_request, now)

    def report(self, holder: str, report: UsageReport) -> Lease:
        """Apply a worker's deltas; the reply carries the current epoch and any cluster-wide pause."""
        now = self._advance()
        state = self._holders.touch(holder, now)
        self._holders.free(state, report.completed + report.returned)
        if report.in_flight is not None:
            state.in_flight = report.in_flight
        if report.returned:
            self._admitted.add(now, -report.returned)
            self._passed.add(now, -report.returned)
            self._step_admitted -= report.returned
            if self._requests is not None:
                self._requests.level = min(self._requests.capacity, self._requests.level + report.returned)
        if self._tokens is not None and report.token_adjust:
            self._tokens.level = min(self._tokens.capacity, self._tokens.level - report.token_adjust)
        self._step_tokens += report.token_adjust
        self._token_use.add(now, report.tokens_used)
        for key in ("returned", "completed", "errors"):
            self.totals[key] += getattr(report, key)
        self.totals["tokens"] += report.tokens_used
        self.totals["wait_s"] += report.wait_s
        self._weigh_refusals(now, report)
        return self._lease_reply(0, 0.0, now)

    def wait_hint(self, want_requests: int, want_tokens: float = 0.0) -> float:
        """Seconds until ``want_requests`` slots could be granted (0 if now; a short poll interval when
        only the in-flight cap blocks, since that frees on reports)."""
        now = self._advance()
        if now < self.paused_until:
            return self.paused_until - now
        per_request = max(0.0, want_tokens) / max(1, want_requests)
        return self._wait_hint(max(1, min(want_requests, self._max_grantable(per_request))), per_request)

    def snapshot(self) -> dict[str, Any]:
        """Current figures: targets, achieved rates over the last 10 s, in flight, 429s, waiting."""
        now = self._advance()
        totals = self.totals
        return {
            "adaptive": self.adaptive,
            "target_rpm": self.target_rpm,
            "ceiling_rpm": self.ceiling_rpm,
            "target_tpm": self.target_tpm,
            "measured_limit_rpm": self.measured_limit_rpm,
            "achieved_rpm": self._per_minute(self._admitted, now),
            "achieved_tpm": self._per_minute(self._token_use, now),
            "in_flight": self._holders.in_flight(),
            "reserved": self.reserved,
            "max_in_flight": self.config.max_in_flight,
            "paused_for_s": max(0.0, self.paused_until - now),
            "epoch": self.epoch,
            "workers": len(self._holders.by_name),
            "requests": totals["granted"] - totals["returned"],
            "total_wait_s": totals["wait_s"],
            **{key: totals[key] for key in ("tokens", "rate_limited", "errors", "cuts", "pauses", "leases")},
        }

    def history(self) -> list[dict[str, float | None]]:
        """Bounded samples ``{t, target_rpm, target_tpm, achieved_rpm, in_flight, rate_limited}`` (``t`` in
        seconds since the policy started; ``rate_limited`` cumulative)."""
        self._advance()
        return list(self._history.samples)

    # ---------------------------------------------------------------- internals: capacity

    def _make_bucket(self, per_minute: float | None, now: float) -> Bucket | None:
        if per_minute is None:
            return None
        bucket = Bucket(rate=per_minute / 60.0, capacity=0.0, level=0.0, last=now)
        bucket.retarget(per_minute / 60.0, self.config.burst_s)
        bucket.level = bucket.capacity  # one burst's worth at once (a known rpm's first grant: see lease)
        return bucket

    def _advance(self) -> float:
        """Bring buckets, AIMD growth, reaping and history up to the clock's now."""
        now = self._clock()
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.refill(now)
        if self._settling is not None and now >= self.paused_until:
            self._start_pacing(now, self._settling)
        if self.adaptive and now - self._step_start >= learning.increase_interval_s(
            self.target_rpm, self.config
        ):
            self._maybe_increase(now)
        if now >= self._next_reap:
            self._holders.reap(now)
            self._next_reap = now + 1.0
        if now >= self._history.next_at:
            self._history.record(now, self._sample(now))
        return now

    def _in_flight_left(self) -> int | None:
        cap = self.config.max_in_flight
        return None if cap is None else cap - self.reserved

    def _available(self, want: int, per_request: float) -> int:
        return grantable(want, per_request, self._requests, self._tokens, self._in_flight_left())

    def _max_grantable(self, per_request: float) -> int:
        """Most slots one lease could ever get: what full buckets and the in-flight cap allow."""
        return most_grantable(per_request, self._requests, self._tokens, self.config.max_in_flight)

    def _wait_hint(self, count: int, per_request: float) -> float:
        return wait_hint(count, per_request, self._requests, self._tokens, self._in_flight_left())

    def _lease_reply(self, granted: int, per_request: float, now: float, wait_hint_s: float = 0.0) -> Lease:
        return Lease(
            requests=granted,
            tokens_per_request=per_request,
            epoch=self.epoch,
            ttl_s=self.config.lease_ttl_s,
            pause_s=max(0.0, self.paused_until - now),
            wait_hint_s=wait_hint_s,
            target_rpm=self.target_rpm,
        )

    # ---------------------------------------------------------------- internals: refusals and the limit

    def _weigh_refusals(self, now: float, report: UsageReport) -> None:
        """Count the report's refusals as evidence; cut and pause only on what the evidence justifies."""
        fresh = report.rate_limited_epoch >= self.epoch  # 429s on slots granted since the last cut
        for pause_s, rate_limited, _ in report.refusals:
            self.refusals.add(Refusal(now, pause_s, rate_limited and fresh))
        if report.rate_limited:
            self.totals["rate_limited"] += report.rate_limited
            self._step_limited += report.rate_limited
            # A 429 on a slot granted before the last cut belongs to the rate before it.
            stale = not fresh and self._last_cut > -math.inf
            self._passed.add(now, -report.rate_limited, at=self._last_cut - 1e-6 if stale else None)
            if fresh and self.refusals.justifies_cut(now):
                # Dated by when the refused requests went out, not by when the report came: a loaded
                # worker's report lags, which read as a lower limit.
                self._cut(now, allowed_again_at(now, report.refusals, self.config.max_pause_s))
        pause_s = self.refusals.pause_s(now, self.config.max_pause_s)
        if pause_s > 0:
            self._pause(now, pause_s)

    def _cut(self, now: float, allowed_at: float) -> None:
        """Set the target to the rate the provider let through, once per window: answers still arriving
        for requests sent at the old rate say nothing about the new one."""
        if now - self._last_cut < self.config.cut_window_s:
            return
        if not self.adaptive:
            if self.target_rpm is not None and self.ceiling_rpm is not None and self.config.rpm is not None:
                self._new_epoch(now)
                self._set_target_rpm(learning.known_trim(self.target_rpm, self.ceiling_rpm), now)
            return
        previous_cut = self._pacing_since
        self._new_epoch(now)
        self._pacing_since = now
        self._start_step(now)
        if self._requests is None or self.target_rpm is None:
            # The first cut of an unpaced run: everything sent so far is still being answered. Hold
            # everyone until those answers are in, then measure (``_start_pacing``).
            self._settling = allowed_at
            self._pause(now, max(learning.SETTLE_S, allowed_at - now))
            return
        last = self.measured_limit_rpm
        measured = self._measured_rpm(now, allowed_at, since=previous_cut)
        target, measured = learning.cut_target(measured, self.target_rpm, last, self.config)
        self._confirmed = self._confirmed + 1 if learning.same_limit(measured, last) else 0
        self.measured_limit_rpm = measured
        self._set_target_rpm(target, now)

    def _new_epoch(self, now: float) -> None:
        self.epoch += 1
        self._last_cut = now
        self.totals["cuts"] += 1

    def _start_pacing(self, now: float, allowed_at: float) -> None:
        """End of the settling after the first cut: pace from now on at the measured rate, no burst."""
        self._settling = None
        measured = self.measured_limit_rpm = self._measured_rpm(now, allowed_at)
        target = min(measured * self.config.headroom, self.ceiling_rpm or math.inf)
        self._requests = self._make_bucket(target, now)
        if self._requests is not None:
            self._requests.level = 0.0
        self._pacing_since = now
        self._set_target_rpm(target, now)
        self._start_step(now)

    def _measured_rpm(self, now: float, allowed_at: float, since: float = -math.inf) -> float:
        """What passed over the last ``RATE_WINDOW_S`` (from the first grant or ``since``, the start of the
        current pacing, if later), per minute of the span until the provider allows again
        (``allowed_at``): a provider that let N through and then asks to wait allows about N per that
        span, whichever way it counts. Measuring from the last cut keeps a token bucket's stored burst,
        spent before it, out of the figure."""
        start = max(self._first_grant if self._first_grant is not None else now, since, now - RATE_WINDOW_S)
        return learning.measured_rpm(self._passed.total(now, since=start), allowed_at - start, 0.0)

    def _maybe_increase(self, now: float) -> None:
        """Grow the target after a clean interval in which the target, not demand, was the bottleneck."""
        elapsed = now - self._step_start
        busy = False
        if self.target_rpm is not None:
            busy = self._step_admitted >= learning.BUSY_SHARE * self.target_rpm / 60.0 * elapsed
        if self.target_tpm is not None:
            busy = busy or self._step_tokens >= learning.BUSY_SHARE * self.target_tpm / 60.0 * elapsed
        if busy and self._step_limited == 0 and now >= self.paused_until and self.target_rpm is not None:
            last = self.measured_limit_rpm
            if last is not None and self.target_rpm > learning.FORGET_LAST_LIMIT * last:
                self.measured_limit_rpm = last = None  # the provider's limit has evidently risen
            target = learning.grown_target(self.target_rpm, last, self._confirmed, self.config)
            factor = target / self.target_rpm
            self._set_target_rpm(target, now)
            self._scale_tpm(factor, now)
        self._start_step(now)

    def _set_target_rpm(self, target: float, now: float) -> None:
        old = self.target_rpm
        self.target_rpm = min(max(MIN_RPM, target), self.ceiling_rpm or math.inf)
        if self._requests is not None:
            self._requests.refill(now)
            self._requests.retarget(self.target_rpm / 60.0, self.config.burst_s)
        if old is not None and target < old:
            self._scale_tpm(self.target_rpm / old, now)

    def _scale_tpm(self, factor: float, now: float) -> None:
        if self.target_tpm is not None and self.tpm_ceiling is not None and self._tokens is not None:
            # The tpm ceiling is the configured tpm. At the floor, requests larger than the bucket still go
            # whenever it is full (see _available).
            self.target_tpm = min(max(60.0, self.target_tpm * factor), self.tpm_ceiling)
            self._tokens.refill(now)
            self._tokens.retarget(self.target_tpm / 60.0, self.config.burst_s)

    def _start_step(self, now: float) -> None:
        self._step_start = now
        self._step_admitted = 0.0
        self._step_tokens = 0.0
        self._step_limited = 0

    # ---------------------------------------------------------------- internals: pauses, history

    def _pause(self, now: float, seconds: float) -> None:
        until = now + min(seconds, self.config.max_pause_s)
        if until > self.paused_until:
            if self.paused_until <= now:
                self.totals["pauses"] += 1
            self.paused_until = until

    def _per_minute(self, window: RateWindow, now: float) -> float:
        """``window``'s total over the last ``RATE_WINDOW_S`` (or since the start), per minute."""
        if now <= self._start:
            return 0.0
        return window.total(now) * 60.0 / max(1e-9, min(RATE_WINDOW_S, now - self._start))

    def _sample(self, now: float) -> dict[str, float | None]:
        return {
            "t": round(now - self._start, 3),
            "target_rpm": None if self.target_rpm is None else round(self.target_rpm, 3),
            "target_tpm": None if self.target_tpm is None else round(self.target_tpm, 3),
            "achieved_rpm": round(self._per_minute(self._admitted, now), 3),
            "in_flight": self._holders.in_flight(),
            "rate_limited": self.totals["rate_limited"],
        }
