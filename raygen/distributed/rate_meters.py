"""The governor's meters: a token bucket, a binned rate window and a bounded history. Pure Python, no
clock of their own (every call passes ``now``)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_S = 10
"""Default span of a ``RateWindow``: as long as the longest window providers commonly count over short of
a minute."""


@dataclass
class Bucket:
    """A token bucket: ``level`` refills at ``rate`` per second up to ``capacity``; it may go negative
    (debt) when a request costs more than is left, which then delays later grants."""

    rate: float
    capacity: float
    level: float
    last: float

    def refill(self, now: float) -> None:
        if now > self.last:
            self.level = min(self.capacity, self.level + (now - self.last) * self.rate)
        self.last = max(self.last, now)

    def retarget(self, rate: float, burst_s: float, minimum: float = 1.0) -> None:
        # One unit more than the burst: a bucket that holds exactly one loses whatever refills between
        # the moment it is full and the next ask (a few ms of lease round trip: ~10% at 20 requests/s).
        self.rate = rate
        self.capacity = minimum + rate * burst_s
        self.level = min(self.level, self.capacity)

    def seconds_until(self, amount: float) -> float:
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate


class RateWindow:
    """Counts in bins of ``bin_s`` seconds over the last ``span_s`` seconds (bounded memory)."""

    def __init__(self, span_s: float = RATE_WINDOW_S, bin_s: float = 0.1):
        self._bin_s = bin_s
        self._bins_kept = round(span_s / bin_s)
        self._bins: deque[list[float]] = deque()  # [bin number, count]

    def add(self, now: float, amount: float, at: float | None = None) -> None:
        """Count ``amount`` now, or in the bin of the earlier moment ``at`` (dropped if no longer kept)."""
        key = math.floor((now if at is None else at) / self._bin_s)
        if at is not None and self._bins and key < self._bins[-1][0]:
            for entry in reversed(self._bins):
                if entry[0] <= key:
                    entry[1] += amount
                    break
        elif self._bins and self._bins[-1][0] == key:
            self._bins[-1][1] += amount
        else:
            self._bins.append([key, amount])
        self._trim(now)

    def total(self, now: float, since: float = -math.inf) -> float:
        """Sum over the kept span, or from the bin of ``since`` on."""
        self._trim(now)
        first = -math.inf if since == -math.inf else math.floor(since / self._bin_s)
        return sum(count for key, count in self._bins if key >= first)

    def _trim(self, now: float) -> None:
        oldest = math.floor(now / self._bin_s) - self._bins_kept
        while self._bins and self._bins[0][0] <= oldest:
            self._bins.popleft()


@dataclass
class History:
    """Target-rate samples every ``every_s``; when full, every other sample is dropped and the interval
    doubles, so a long run keeps its whole shape in bounded memory."""

    max_len: int
    every_s: float = 1.0
    samples: list[dict] = field(default_factory=list)
    next_at: float = 0.0
