"""The arithmetic of the cluster-wide rate governor: pure Python, no Ray, no asyncio, injectable clock.

``GovernorPolicy`` holds the state of one governor (raygen.distributed.governor wraps it in a Ray actor):

- two token buckets (requests, tokens) refilled at the current target rate, holding at most ``burst_s``
  seconds' worth, so a minute's budget never goes out at once;
- a cluster-wide in-flight count (leased slots not yet returned or completed);
- learning an unknown limit: with no ``rpm`` nothing is paced until the first 429; a 429 sets the target
  to the rate the provider let through (``measured_limit_rpm``), once per ``cut_window_s`` and only for
  requests admitted since the last cut, so one burst of 429s cuts once; clean, busy traffic then grows the
  target: doubling far below the measured limit (slow start), additively near it (AIMD);
- a global pause after a 429 until its Retry-After (or its ``x-ratelimit-reset-*`` header) passes.

Workers take *leases* and send back ``UsageReport`` deltas (raygen.distributed.leases).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from raygen.config import GovernorConfig
from raygen.distributed.leases import Lease, UsageReport
from raygen.distributed.rate_meters import RATE_WINDOW_S, Bucket, History, RateWindow

MIN_RPM = 1.0
"""The adaptive target never drops below this (requests per minute)."""
_SLOW_START = 2.0
"""Growth multiplier per interval while the target is far below the measured limit (or none is known)."""
_NEAR_LAST_LIMIT = 0.9
"""Below this share of the measured limit, the target grows fast."""
_FORGET_LAST_LIMIT = 1.5
"""Above this multiple of the measured limit without a 429, the old limit is forgotten."""
_SAME_LIMIT = 0.1
"""Two cuts measured "the same limit" when the rates differ by at most this share."""
_MAX_PROBE_HALVINGS = 3
"""Probing past a limit measured alike in several cuts in a row slows down to 1/2**this of its pace."""
_BUSY_SHARE = 0.8
"""The target only grows when at least this share of it was used during the last interval."""
_MIN_STEP_REQUESTS = 3
"""An increase interval spans at least this many requests' worth of the target, so that "busy" is judged on
more than one request at low rates."""
_KNOWN_TRIM = 0.015
"""A 429 under a known ``rpm`` (adaptive off) lowers the pace by this share of it: the provider counts
more strictly than the pacing allows for (a one-second sliding window with network jitter)."""
_KNOWN_FLOOR = 0.9
"""... but never below this share of the configured pace."""
_RATE_WINDOW_S = RATE_WINDOW_S
"""Window of the achieved-rate figures in ``snapshot()`` and of the rate measured when a 429 comes."""
_MIN_MEASURE_S = 1.0
"""The measured rate divides by at least this span (passed time plus Retry-After): no provider counts over
less than a second, and a token bucket's stored burst must not read as a rate."""
_SETTLE_S = 0.3
"""After the first 429 of an unpaced run, nothing is granted for this long (or the Retry-After, if longer)
so that the answers to everything already sent arrive before the rate is measured."""
_HOLDER_TIMEOUT_S = 60.0
"""A worker silent for this long is presumed dead and its reserved slots are freed."""


@dataclass
class _Holder:
    outstanding: int = 0
    """Slots leased to this worker and not yet completed or returned."""
    in_flight: int = 0
    last_seen: float = 0.0


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
        if known_rpm is not None:
            self.ceiling_rpm: float | None = known_rpm
            self.target_rpm: float | None = known_rpm
        elif self.adaptive:
            # No initial rate: unpaced (no request bucket) until the first 429 sets one.
            self.ceiling_rpm, self.target_rpm = config.max_rpm, config.initial_rpm
        else:
            self.ceiling_rpm = self.target_rpm = None
        self.target_tpm = self.tpm_ceiling
        self._requests = self._make_bucket(self.target_rpm, now)
        self._tokens = self._make_bucket(self.target_tpm, now)
        self._holder_timeout_s = holder_timeout_s
        self._holders: dict[str, _Holder] = {}
        self.reserved = 0
        """Slots leased and not yet completed or returned, over all workers."""
        self.epoch = 0
        self.paused_until = now
        self._last_cut = -math.inf
        self.measured_limit_rpm: float | None = None
        """The rate the provider let through when its last 429 came (None before any)."""
        self._confirmed = 0  # cuts in a row that measured about the same limit as the one before
        self._first_grant: float | None = None
        self._settling: tuple[float, float] | None = None  # (first 429 at, its Retry-After)
        self._pacing_since = -math.inf  # when the current target was set by a cut
        self._step_start = now
        self._step_admitted = 0.0
        self._step_tokens = 0.0
        self._step_limited = 0
        self._admitted = RateWindow()
        self._passed = RateWindow()  # admitted minus returned minus answered 429
        self._token_use = RateWindow()
        self._next_reap = now
        self.totals = {
            "granted": 0,
            "returned": 0,
            "completed": 0,
            "rate_limited": 0,
            "errors": 0,
            "cuts": 0,
            "pauses": 0,
            "wait_s": 0.0,
            "leases": 0,
            "tokens": 0,
        }
        self._history = History(max_len=history_len, next_at=now)

    # ---------------------------------------------------------------- public API

    def lease(
        self, holder: str, want_requests: int, want_tokens: float = 0.0, min_requests: int = 1
    ) -> Lease:
        """Grant up to ``want_requests`` slots (for about ``want_tokens`` tokens in total) now, or nothing
        if fewer than ``min_requests`` (clamped to what the buckets can ever hold) are available."""
        now = self._advance()
        state = self._touch(holder, now)
        if want_requests <= 0:
            return self._lease_reply(0, 0.0, now)
        per_request = max(0.0, want_tokens) / want_requests
        if now < self.paused_until:
            return self._lease_reply(0, per_request, now, wait_hint_s=self.paused_until - now)
        if self._first_grant is None and self.config.rpm is not None:
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
        self.reserved += granted
        state.outstanding += granted
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
        state = self._touch(holder, now)
        freed = min(state.outstanding, report.completed + report.returned)
        state.outstanding -= freed
        self.reserved = max(0, self.reserved - freed)
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
        self.totals["returned"] += report.returned
        self.totals["completed"] += report.completed
        self.totals["errors"] += report.errors
        self.totals["tokens"] += report.tokens_used
        self.totals["wait_s"] += report.wait_s
        if report.rate_limited:
            self.totals["rate_limited"] += report.rate_limited
            self._step_limited += report.rate_limited
            # A 429 on a slot granted before the last cut belongs to the rate before it.
            stale = report.rate_limited_epoch < self.epoch and self._last_cut > -math.inf
            self._passed.add(now, -report.rate_limited, at=self._last_cut - 1e-6 if stale else None)
            self._cut(now, report.rate_limited_epoch, report.pause_s)
        if report.pause_s > 0:
            self._pause(now, report.pause_s)
        return self._lease_reply(0, 0.0, now)

    def wait_hint(self, want_requests: int, want_tokens: float = 0.0) -> float:
        """Seconds until ``want_requests`` slots could be granted (0 if now; a short poll interval when
        only the in-flight cap blocks, since that frees on reports)."""
        now = self._advance()
        if now < self.paused_until:
            return self.paused_until - now
        per_request = max(0.0, want_tokens) / max(1, want_requests)
        return self._wait_hint(max(1, min(want_requests, self._max_grantable(per_request))), per_request)

    def snapshot(self) -> dict:
        """Current figures: targets, achieved rates over the last 10 s, in flight, 429s, waiting."""
        now = self._advance()
        span = max(1e-9, min(_RATE_WINDOW_S, now - self._start))
        return {
            "adaptive": self.adaptive,
            "target_rpm": self.target_rpm,
            "ceiling_rpm": self.ceiling_rpm,
            "target_tpm": self.target_tpm,
            "measured_limit_rpm": self.measured_limit_rpm,
            "achieved_rpm": self._admitted.total(now) * 60.0 / span if now > self._start else 0.0,
            "achieved_tpm": self._token_use.total(now) * 60.0 / span if now > self._start else 0.0,
            "in_flight": sum(h.in_flight for h in self._holders.values()),
            "reserved": self.reserved,
            "max_in_flight": self.config.max_in_flight,
            "paused_for_s": max(0.0, self.paused_until - now),
            "epoch": self.epoch,
            "workers": len(self._holders),
            "requests": self.totals["granted"] - self.totals["returned"],
            "tokens": self.totals["tokens"],
            "rate_limited": self.totals["rate_limited"],
            "errors": self.totals["errors"],
            "cuts": self.totals["cuts"],
            "pauses": self.totals["pauses"],
            "total_wait_s": self.totals["wait_s"],
            "leases": self.totals["leases"],
        }

    def history(self) -> list[dict]:
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

    def _touch(self, holder: str, now: float) -> _Holder:
        state = self._holders.get(holder)
        if state is None:
            state = self._holders[holder] = _Holder()
        state.last_seen = now
        return state

    def _advance(self) -> float:
        """Bring buckets, AIMD growth, reaping and history up to the clock's now."""
        now = self._clock()
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.refill(now)
        if self._settling is not None and now >= self.paused_until:
            self._start_pacing(now)
        if self.adaptive and now - self._step_start >= self._increase_interval_s():
            self._maybe_increase(now)
        if now >= self._next_reap:
            self._reap(now)
        if now >= self._history.next_at:
            self._sample(now)
        return now

    def _available(self, want: int, per_request: float) -> int:
        available = want
        if self._requests is not None:
            available = min(available, math.floor(self._requests.level + 1e-9))
        if self.config.max_in_flight is not None:
            available = min(available, self.config.max_in_flight - self.reserved)
        if self._tokens is not None and per_request > 0:
            by_tokens = math.floor(self._tokens.level / per_request + 1e-9) if self._tokens.level > 0 else 0
            # A request larger than the whole bucket goes when the bucket is full, leaving a debt.
            if by_tokens == 0 and self._tokens.level >= self._tokens.capacity - 1e-9:
                by_tokens = 1
            available = min(available, by_tokens)
        return max(0, available)

    def _max_grantable(self, per_request: float) -> int:
        """Most slots one lease could ever get: what full buckets and the in-flight cap allow."""
        most = math.inf
        if self._requests is not None:
            most = math.floor(self._requests.capacity + 1e-9)
        if self.config.max_in_flight is not None:
            most = min(most, self.config.max_in_flight)
        if self._tokens is not None and per_request > 0:
            most = min(most, max(1, math.floor(self._tokens.capacity / per_request)))
        return int(min(most, 1_000_000))

    def _wait_hint(self, count: int, per_request: float) -> float:
        hint = 0.0
        if self._requests is not None:
            hint = max(hint, self._requests.seconds_until(count))
        if self._tokens is not None and per_request > 0:
            need = min(count * per_request, self._tokens.capacity)
            hint = max(hint, self._tokens.seconds_until(need))
        if self.config.max_in_flight is not None and self.config.max_in_flight - self.reserved < count:
            hint = max(hint, 0.05)  # frees only when a worker reports; poll
        return hint

    def _lease_reply(self, granted: int, per_request: float, now: float, wait_hint_s: float = 0.0) -> Lease:
        return Lease(
            requests=granted,
            tokens_per_request=per_request,
            epoch=self.epoch,
            ttl_s=self.config.lease_ttl_s,
            pause_s=max(0.0, self.paused_until - now),
            wait_hint_s=wait_hint_s,
            target_rpm=self.target_rpm,
            paced=self._requests is not None
            or self._tokens is not None
            or self.config.max_in_flight is not None
            or self._settling is not None,
        )

    # ---------------------------------------------------------------- internals: learning the limit

    def _cut(self, now: float, epoch: int, pause_s: float = 0.0) -> None:
        """Set the target to the rate the provider let through, once per window and only for 429s on
        capacity granted since the last cut: answers still arriving for requests sent at the old rate say
        nothing about the new one."""
        if epoch < self.epoch or now - self._last_cut < self.config.cut_window_s:
            return
        if not self.adaptive:
            if self.target_rpm is not None and self.config.rpm is not None:
                floor = _KNOWN_FLOOR * self.ceiling_rpm
                self._trim_known(max(floor, self.target_rpm - _KNOWN_TRIM * self.ceiling_rpm), now)
            return
        previous_cut = self._pacing_since
        self.epoch += 1
        self._last_cut = self._pacing_since = now
        self.totals["cuts"] += 1
        self._start_step(now)
        if self._requests is None:
            # The first 429 of an unpaced run: everything sent so far is still being answered. Hold
            # everyone until those answers are in, then measure (``_start_pacing``).
            self._settling = (now, pause_s)
            self._pause(now, max(_SETTLE_S, pause_s))
            return
        measured = self._measured_rpm(now, now, pause_s, since=previous_cut)
        target = measured * self.config.headroom
        if target >= self.target_rpm:
            # Sent at the target, refused, yet measured at or above it: the figure is inflated (a burst
            # the provider had stored, a window longer than ours), so fall back to a plain cut.
            target = self.target_rpm * self.config.decrease_factor
            measured = min(measured, self.target_rpm)
        elif self.measured_limit_rpm is None:
            # Slow start overshot: the rate before the last doubling passed, and the measured figure
            # spans the whole climb, so it reads low.
            target = max(target, self.target_rpm / _SLOW_START)
        elif target < self.target_rpm * self.config.decrease_factor:
            # Near a known limit, no deeper than a plain cut in one step: right after an overshoot a
            # sliding window lets through only what expires, less than it allows on average. A further
            # 429 cuts again.
            target = self.target_rpm * self.config.decrease_factor
        last = self.measured_limit_rpm
        same = last is not None and abs(measured - last) <= _SAME_LIMIT * last
        self._confirmed = self._confirmed + 1 if same else 0
        self.measured_limit_rpm = measured
        self._set_target_rpm(target, now)

    def _trim_known(self, target: float, now: float) -> None:
        self.epoch += 1
        self._last_cut = now
        self.totals["cuts"] += 1
        self._set_target_rpm(target, now)

    def _start_pacing(self, now: float) -> None:
        """End of the settling after the first 429: pace from now on at the measured rate, with no burst."""
        limited_at, pause_s = self._settling
        self._settling = None
        self.measured_limit_rpm = self._measured_rpm(now, limited_at, pause_s)
        target = min(self.measured_limit_rpm * self.config.headroom, self.ceiling_rpm or math.inf)
        self._requests = self._make_bucket(target, now)
        self._requests.level = 0.0
        self._pacing_since = now
        self._set_target_rpm(target, now)
        self._start_step(now)

    def _measured_rpm(self, now: float, limited_at: float, pause_s: float, since: float = -math.inf) -> float:
        """What passed over the last ``_RATE_WINDOW_S`` until the 429 at ``limited_at`` (from the first
        grant or ``since``, the start of the current pacing, if later), per minute of that span plus the
        provider's Retry-After: a provider that let N through and then asks for W more seconds allows
        about N per (span + W), whichever way it counts. Measuring from the last cut keeps a token
        bucket's stored burst, spent before it, out of the figure."""
        start = max(self._first_grant if self._first_grant is not None else limited_at, since)
        start = max(start, now - _RATE_WINDOW_S)
        span = max(0.0, limited_at - start)
        passed = max(1.0, self._passed.total(now, since=start))
        return passed * 60.0 / max(_MIN_MEASURE_S, span + max(0.0, pause_s))

    def _increase_interval_s(self) -> float:
        if self.target_rpm is None:
            return self.config.increase_interval_s
        return max(self.config.increase_interval_s, _MIN_STEP_REQUESTS * 60.0 / self.target_rpm)

    def _maybe_increase(self, now: float) -> None:
        """Grow the target after a clean interval in which the target, not demand, was the bottleneck:
        doubling while far below the measured limit or before any 429 (slow start), else by
        ``increase_fraction`` of the measured limit (additive increase)."""
        elapsed = now - self._step_start
        busy = False
        if self.target_rpm is not None:
            busy = self._step_admitted >= _BUSY_SHARE * self.target_rpm / 60.0 * elapsed
        if self.target_tpm is not None:
            busy = busy or self._step_tokens >= _BUSY_SHARE * self.target_tpm / 60.0 * elapsed
        if busy and self._step_limited == 0 and now >= self.paused_until and self.target_rpm is not None:
            last = self.measured_limit_rpm
            if last is not None and self.target_rpm > _FORGET_LAST_LIMIT * last:
                self.measured_limit_rpm = last = None  # the provider's limit has evidently risen
            if last is None:
                target = self.target_rpm * _SLOW_START
            elif self.target_rpm < _NEAR_LAST_LIMIT * last:
                # Recover quickly, but approach the rate that last drew a 429 in small steps.
                target = min(self.target_rpm * _SLOW_START, _NEAR_LAST_LIMIT * last)
            elif self.target_rpm < last:
                target = self.target_rpm + self.config.increase_fraction * last
                if self._confirmed:  # a limit measured alike twice: go up to it, probe past it slowly
                    target = min(target, last)
            else:
                # Past the measured limit a window provider answers late (a sliding window of 10 s only
                # refuses once it is full), so probe a third as fast; and half as fast again for each
                # cut in a row that measured the same limit: every probe past a fixed limit costs 429s.
                step = self.config.increase_fraction * last / 3
                target = self.target_rpm + step / 2 ** min(self._confirmed, _MAX_PROBE_HALVINGS)
            factor = target / self.target_rpm
            self._set_target_rpm(target, now)
            self._scale_tpm(factor, now)
        self._start_step(now)

    def _set_target_rpm(self, target: float, now: float) -> None:
        old = self.target_rpm
        self.target_rpm = min(max(MIN_RPM, target), self.ceiling_rpm or math.inf)
        self._requests.refill(now)
        self._requests.retarget(self.target_rpm / 60.0, self.config.burst_s)
        if old is not None and target < old:
            self._scale_tpm(self.target_rpm / old, now)

    def _scale_tpm(self, factor: float, now: float) -> None:
        if self.target_tpm is not None:
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

    # ---------------------------------------------------------------- internals: pauses, workers, history

    def _pause(self, now: float, seconds: float) -> None:
        until = now + min(seconds, self.config.max_pause_s)
        if until > self.paused_until:
            if self.paused_until <= now:
                self.totals["pauses"] += 1
            self.paused_until = until

    def _reap(self, now: float) -> None:
        for name, state in list(self._holders.items()):
            if now - state.last_seen > self._holder_timeout_s:
                self.reserved = max(0, self.reserved - state.outstanding)
                del self._holders[name]
        self._next_reap = now + 1.0

    def _sample(self, now: float) -> None:
        hist = self._history
        snap_target = self.target_rpm
        span = max(1e-9, min(_RATE_WINDOW_S, now - self._start))
        hist.samples.append(
            {
                "t": round(now - self._start, 3),
                "target_rpm": None if snap_target is None else round(snap_target, 3),
                "target_tpm": None if self.target_tpm is None else round(self.target_tpm, 3),
                "achieved_rpm": round(self._admitted.total(now) * 60.0 / span, 3)
                if now > self._start
                else 0.0,
                "in_flight": sum(h.in_flight for h in self._holders.values()),
                "rate_limited": self.totals["rate_limited"],
            }
        )
        if len(hist.samples) >= hist.max_len:
            hist.samples = hist.samples[::2]
            hist.every_s *= 2
        hist.next_at = now + hist.every_s
