"""The messages between a worker's ``GovernorClient`` and the cluster's governor (picklable dataclasses).

Workers do not ask per request: they take *leases* (a few request slots, each charged an estimated number
of tokens) and send back batched ``UsageReport`` deltas. Deltas commute, so reports and lease calls of one
worker may cross in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lease:
    """Capacity granted to one worker: ``requests`` slots, each charged ``tokens_per_request`` tokens."""

    requests: int = 0
    tokens_per_request: float = 0.0
    epoch: int = 0
    """The policy's cut counter when granted; 429s of older epochs do not cut again."""
    ttl_s: float = 0.0
    """Unused slots must be returned after this many seconds."""
    pause_s: float = 0.0
    """The cluster is paused for this much longer (Retry-After); nothing is granted meanwhile."""
    wait_hint_s: float = 0.0
    """When nothing was granted: roughly when to ask again."""
    target_rpm: float | None = None


@dataclass
class UsageReport:
    """What a worker tells the governor, as deltas since its previous report (so reports commute)."""

    completed: int = 0
    """Requests that finished (any status)."""
    returned: int = 0
    """Leased slots given back unused."""
    token_adjust: float = 0.0
    """Sum of (actual tokens - charged tokens) of finished requests, minus the charge of returned slots."""
    tokens_used: int = 0
    """Actual tokens of finished requests (for the achieved-tpm figure)."""
    rate_limited: int = 0
    """429 answers."""
    rate_limited_epoch: int = -1
    """Highest lease epoch among the 429'd requests (-1: none)."""
    errors: int = 0
    """5xx, timeouts and connection errors (counted, never cut the rate)."""
    refusals: list[tuple[float, bool, float]] = field(default_factory=list)
    """One ``(pause asked in seconds, was a 429, seconds since the request was sent)`` per answer that
    refused or asked to wait (Retry-After or rate-limit reset headers; 0.0 if it named no time): evidence,
    never a verdict (raygen.distributed.refusals). The age dates the refusal at the provider, which is
    what measuring its limit needs: the report comes later, by as much as a loaded worker is slow."""
    wait_s: float = 0.0
    """Time callers spent waiting in acquire()."""
    in_flight: int | None = None
    """The worker's current number of requests in flight (absolute), None if unchanged."""

    def is_empty(self) -> bool:
        return self == UsageReport(in_flight=self.in_flight)

    def merge(self, other: UsageReport) -> None:
        """Add ``other`` into this report (used when a send fails and the deltas must be kept)."""
        self.completed += other.completed
        self.returned += other.returned
        self.token_adjust += other.token_adjust
        self.tokens_used += other.tokens_used
        self.rate_limited += other.rate_limited
        self.rate_limited_epoch = max(self.rate_limited_epoch, other.rate_limited_epoch)
        self.errors += other.errors
        self.refusals = other.refusals + self.refusals
        self.wait_s += other.wait_s
        if self.in_flight is None:
            self.in_flight = other.in_flight


@dataclass
class Holder:
    """One worker as the governor sees it."""

    outstanding: int = 0
    """Slots leased to this worker and not yet completed or returned."""
    in_flight: int = 0
    last_seen: float = 0.0


class Holders:
    """The workers holding leases; a worker silent for ``timeout_s`` is presumed dead and its slots free."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.by_name: dict[str, Holder] = {}
        self.reserved = 0
        """Slots leased and not yet completed or returned, over all workers."""

    def touch(self, name: str, now: float) -> Holder:
        holder = self.by_name.get(name)
        if holder is None:
            holder = self.by_name[name] = Holder()
        holder.last_seen = now
        return holder

    def grant(self, holder: Holder, count: int) -> None:
        holder.outstanding += count
        self.reserved += count

    def free(self, holder: Holder, count: int) -> None:
        """``count`` of the holder's slots completed or came back (never more than it holds)."""
        freed = min(holder.outstanding, count)
        holder.outstanding -= freed
        self.reserved = max(0, self.reserved - freed)

    def reap(self, now: float) -> None:
        for name, holder in list(self.by_name.items()):
            if now - holder.last_seen > self.timeout_s:
                self.reserved = max(0, self.reserved - holder.outstanding)
                del self.by_name[name]

    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.by_name.values())
