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


def grantable(
    want: int, per_request: float, requests: Bucket | None, tokens: Bucket | None, in_flight_left: int | None
) -> int:
    """Slots grantable now, up to ``want`` of ``per_request`` tokens each: what the buckets hold and the
    in-flight cap leaves (None: no such limit)."""
    available = want
    if requests is not None:
        available = min(available, math.floor(requests.level + 1e-9))
    if in_flight_left is not None:
        available = min(available, in_flight_left)
    if tokens is not None and per_request > 0:
        by_tokens = math.floor(tokens.level / per_request + 1e-9) if tokens.level > 0 else 0
        # A request larger than the whole bucket goes when the bucket is full, leaving a debt.
        if by_tokens == 0 and tokens.level >= tokens.capacity - 1e-9:
            by_tokens = 1
        available = min(available, by_tokens)
    return max(0, available)


def most_grantable(
    per_request: float, requests: Bucket | None, tokens: Bucket | None, max_in_flight: int | None
) -> int:
    """Most slots one grant could ever get: what full buckets and the in-flight cap allow."""
    most = math.inf
    if requests is not None:
        most = math.floor(requests.capacity + 1e-9)
    if max_in_flight is not None:
        most = min(most, max_in_flight)
    if tokens is not None and per_request > 0:
        most = min(most, max(1, math.floor(tokens.capacity / per_request)))
    return int(min(most, 1_000_000))


def wait_hint(
    count: int, per_request: float, requests: Bucket | None, tokens: Bucket | None, in_flight_left: int | None
) -> float:
    """Seconds until ``count`` slots could be granted (a short poll interval when only the in-flight cap
    blocks: that frees when a worker reports)."""
    hint = 0.0
    if requests is not None:
        hint = max(hint, requests.seconds_until(count))
    if tokens is not None and per_request > 0:
        hint = max(hint, tokens.seconds_until(min(count * per_request, tokens.capacity)))
    if in_flight_left is not None and in_flight_left < count:
        hint = max(hint, 0.05)
    return hint


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
    samples: list[dict[str, float | None]] = field(default_factory=list)
    next_at: float = 0.0

    def record(self, now: float, sample: dict[str, float | None]) -> None:
        """Keep ``sample`` (taken at ``now``); the next one is due ``every_s`` later."""
        self.samples.append(sample)
        if len(self.samples) >= self.max_len:
            self.samples = self.samples[::2]
            self.every_s *= 2
        self.next_at = now + self.every_s
