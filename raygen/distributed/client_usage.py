"""A worker's side of the governor's bookkeeping: the permits and leased slots it holds, the usage it owes
the governor (``PendingUsage``) and how far token estimates are off (``TokenRatio``). No Ray, no asyncio."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from raygen.distributed.leases import UsageReport

_RATIO_STEP = 0.2
"""Each reported usage moves the learned actual/estimate ratio a fifth of the way to what it saw."""
_RATIO_BOUNDS = (0.02, 50.0)


@dataclass
class Permit:
    """What ``GovernorClient.acquire`` hands out (opaque to callers)."""

    epoch: int
    charged_tokens: float
    estimated_tokens: int = 0
    """The caller's own estimate, before the learned correction."""
    granted_at: float = 0.0
    """Loop time the permit was handed out (the request went out right after)."""
    released: bool = False


@dataclass
class LocalLease:
    """Slots of one lease not yet handed out."""

    left: int
    tokens_per_request: float
    epoch: int
    expires_at: float


class DemandMeter:
    """Permits asked for over about the last second: what a lease sized by time carries. Counts, not a
    list of times, so a worker asking thousands of times a second is measured whole (a 256-entry list of
    times capped its estimate at 256 a second)."""

    def __init__(self) -> None:
        self._start = 0.0
        self._count = 0
        self._previous = 0
        """Permits asked for in the window before the current one (0 when that was not the last second)."""

    def add(self, now: float) -> None:
        self._roll(now)
        self._count += 1

    def per_s(self, now: float) -> int:
        """The larger of the last whole second's count and the current second's so far."""
        self._roll(now)
        return max(self._previous, self._count)

    def _roll(self, now: float) -> None:
        if now - self._start >= 1.0:
            self._previous = self._count if now - self._start < 2.0 else 0
            self._start, self._count = now, 0


@dataclass
class Waiter:
    future: asyncio.Future[Permit]
    since: float
    raw_tokens: int
    """The caller's own estimate; the learned ratio is applied when a lease is asked for."""


class TokenRatio:
    """Actual tokens / estimated tokens, learned from reported usage: charging a 512-token max_tokens
    allowance for a 50-token answer and refunding later would hold a token limit at the estimate's rate."""

    def __init__(self) -> None:
        self.value = 1.0
        self._samples = 0

    def learn(self, used: float, estimated: int) -> None:
        seen = min(_RATIO_BOUNDS[1], max(_RATIO_BOUNDS[0], used / estimated))
        step = _RATIO_STEP if self._samples else 1.0  # the first answer replaces the guess
        self.value += step * (seen - self.value)
        self._samples += 1


class PendingUsage:
    """Usage not yet reported, and since when it waits (reports are batched)."""

    def __init__(self) -> None:
        self.report = UsageReport()
        self.since: float | None = None

    def note(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def take(self) -> UsageReport:
        report, self.report = self.report, UsageReport()
        self.since = None
        return report

    def restore(self, report: UsageReport, now: float) -> None:
        """Put back what a failed send took, so the next one carries it."""
        self.report.merge(report)
        if not report.is_empty():
            self.note(now)

    def settle(self, permit: Permit, used: int, status: int | None, ratio: TokenRatio) -> None:
        """Count one finished request of ``used`` tokens (0: no usage reported) with ``status``."""
        report = self.report
        report.completed += 1
        charged: float = used
        if used <= 0:
            # No usage: a request that got through (or timed out, maybe after being served) keeps its
            # estimate; one the provider refused consumed nothing.
            charged = permit.charged_tokens if status is None or status == 200 else 0
        elif permit.estimated_tokens > 0:
            ratio.learn(used, permit.estimated_tokens)
        report.token_adjust += charged - permit.charged_tokens
        report.tokens_used += int(charged)
        if status == 429:
            report.rate_limited += 1
            report.rate_limited_epoch = max(report.rate_limited_epoch, permit.epoch)
        elif status is None or status >= 500:
            report.errors += 1

    def give_back(self, permit: Permit) -> None:
        """A permit handed out but never used (its caller was cancelled)."""
        self.report.returned += 1
        self.report.token_adjust -= permit.charged_tokens

    def return_slots(self, lease: LocalLease) -> None:
        self.report.returned += lease.left
        self.report.token_adjust -= lease.left * lease.tokens_per_request
