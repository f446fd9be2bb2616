"""The simulator's rate limits, counted the ways providers count them.

Each counter admits an amount (1 per request, or a request's tokens) or says how long until it could:

- ``TokenBucket``: refills continuously at the rate, holds at most ``burst``;
- ``FixedWindow``: at most ``rate * window_s`` per window, windows aligned to the clock, the count resets
  at each boundary (so two bursts either side of a boundary both pass);
- ``SlidingWindow``: at most ``rate * window_s`` in *any* interval of ``window_s`` (an exact log of what
  was admitted), the strictest of the three for a sender that bunches.

``RateLimits`` combines a request counter and a token counter of one kind, as a gateway checks both.
Refused requests are not counted (as at OpenAI and Anthropic).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from raygen.model.configs import SimConfig


class RateCounter(Protocol):
    limit: int
    """The configured per-minute limit (for the ``x-ratelimit-limit-*`` header)."""

    def wait_for(self, amount: float = 1.0) -> float:
        """0.0 if ``amount`` would be admitted now, else the seconds until it could be (nothing counted)."""
        ...

    def take(self, amount: float = 1.0) -> None:
        """Count ``amount`` as admitted."""
        ...

    def remaining(self) -> float:
        """What could still be admitted right now."""
        ...

    def reset_s(self) -> float:
        """Seconds until the counter is back to its full allowance."""
        ...

    def reset(self) -> None:
        """Forget everything admitted so far."""
        ...


class TokenBucket:
    """``per_minute / 60`` per second, at most ``burst`` stored (default one second's worth, at least 1)."""

    def __init__(
        self, per_minute: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, burst if burst is not None else self.rate)
        self.limit = max(1, round(per_minute))
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        self.tokens = self.capacity
        self._stamp = self._clock()

    def _refill(self) -> None:
        now = self._clock()
        self.tokens = min(self.capacity, self.tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait_for(self, amount: float = 1.0) -> float:
        self._refill()
        # An amount larger than the bucket passes when the bucket is full (it could never pass otherwise).
        need = min(amount, self.capacity)
        return 0.0 if self.tokens >= need - 1e-9 else (need - self.tokens) / self.rate

    def take(self, amount: float = 1.0) -> None:
        self._refill()
        self.tokens -= amount

    def remaining(self) -> float:
        self._refill()
        return max(0.0, self.tokens)

    def reset_s(self) -> float:
        self._refill()
        return max(0.0, self.capacity - self.tokens) / self.rate


class _Window:
    """What both kinds of window share: ``per_minute * window_s / 60`` allowed per window."""

    def __init__(self, per_minute: float, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.capacity = max(1.0, per_minute * window_s / 60.0)
        self.limit = max(1, round(per_minute))
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        raise NotImplementedError


class FixedWindow(_Window):
    """At most ``per_minute * window_s / 60`` per window ``[k * window_s, (k + 1) * window_s)`` (clock)."""

    def reset(self) -> None:
        self.used = 0.0
        self._window = math.floor(self._clock() / self.window_s)

    def _roll(self) -> float:
        now = self._clock()
        window = math.floor(now / self.window_s)
        if window != self._window:
            self._window, self.used = window, 0.0
        return now

    def wait_for(self, amount: float = 1.0) -> float:
        now = self._roll()
        if self.used + amount <= self.capacity + 1e-9 or self.used == 0:
            return 0.0
        return (self._window + 1) * self.window_s - now

    def take(self, amount: float = 1.0) -> None:
        self._roll()
        self.used += amount

    def remaining(self) -> float:
        self._roll()
        return max(0.0, self.capacity - self.used)

    def reset_s(self) -> float:
        now = self._roll()
        return (self._window + 1) * self.window_s - now if self.used else 0.0


class SlidingWindow(_Window):
    """At most ``per_minute * window_s / 60`` admitted within any ``window_s`` seconds."""

    def reset(self) -> None:
        self._log: deque[tuple[float, float]] = deque()  # (admitted at, amount)
        self.used = 0.0

    def _expire(self) -> float:
        now = self._clock()
        while self._log and self._log[0][0] <= now - self.window_s:
            self.used -= self._log.popleft()[1]
        if not self._log:
            self.used = 0.0  # no float drift once empty
        return now

    def wait_for(self, amount: float = 1.0) -> float:
        now = self._expire()
        if self.used + amount <= self.capacity + 1e-9 or not self._log:
            return 0.0
        # Wait until enough of the oldest entries have left the window.
        left = self.used
        for stamp, taken in self._log:
            left -= taken
            if left + amount <= self.capacity + 1e-9:
                return stamp + self.window_s - now
        return self._log[-1][0] + self.window_s - now

    def take(self, amount: float = 1.0) -> None:
        self._log.append((self._expire(), amount))
        self.used += amount

    def remaining(self) -> float:
        self._expire()
        return max(0.0, self.capacity - self.used)

    def reset_s(self) -> float:
        now = self._expire()
        return self._log[-1][0] + self.window_s - now if self._log else 0.0


def make_counter(
    per_minute: float, cfg: SimConfig, clock: Callable[[], float] = time.monotonic, burst: float | None = None
) -> RateCounter:
    """The counter ``cfg.rate_limit_kind`` names, for a limit of ``per_minute``."""
    if cfg.rate_limit_kind == "fixed_window":
        return FixedWindow(per_minute, cfg.rate_limit_window_s, clock)
    if cfg.rate_limit_kind == "sliding_window":
        return SlidingWindow(per_minute, cfg.rate_limit_window_s, clock)
    return TokenBucket(per_minute, burst, clock)


class RateLimits:
    """The simulator's gateway: a request counter and a token counter (each optional), checked together:
    a request passes only if both admit it, and then both count it."""

    def __init__(self, cfg: SimConfig, clock: Callable[[], float] = time.monotonic):
        self.requests = (
            None
            if cfg.rate_limit_rpm is None
            else make_counter(cfg.rate_limit_rpm, cfg, clock, cfg.rate_limit_burst)
        )
        self.tokens = None if cfg.rate_limit_tpm is None else make_counter(cfg.rate_limit_tpm, cfg, clock)

    @property
    def counts_tokens(self) -> bool:
        return self.tokens is not None

    def reset(self) -> None:
        for counter in (self.requests, self.tokens):
            if counter is not None:
                counter.reset()

    def try_admit(self, tokens: float) -> float:
        """Admit and count a request of ``tokens`` tokens: 0.0; else the seconds until both would admit it
        (nothing counted)."""
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.wait_for(1.0)
        if self.tokens is not None:
            wait = max(wait, self.tokens.wait_for(tokens))
        if wait > 0:
            return wait
        if self.requests is not None:
            self.requests.take(1.0)
        if self.tokens is not None:
            self.tokens.take(tokens)
        return 0.0

    def headers(self) -> dict[str, str]:
        """OpenAI-style ``x-ratelimit-*`` headers (reset: time until the allowance is full again)."""
        out: dict[str, str] = {}
        for name, counter in (("requests", self.requests), ("tokens", self.tokens)):
            if counter is not None:
                out[f"x-ratelimit-limit-{name}"] = str(counter.limit)
                out[f"x-ratelimit-remaining-{name}"] = str(int(counter.remaining()))
                out[f"x-ratelimit-reset-{name}"] = f"{math.ceil(counter.reset_s() * 1000)}ms"
        return out
