"""The worker side of the rate governor: ``GovernorClient``, one per worker process and event loop.

It implements ``raygen.model.gate.RateGate`` for every session in the process: permits come from small
leases taken from the cluster's ``GovernorService`` (raygen.distributed.governor), and usage goes back in
batched reports, so a busy worker makes far fewer remote calls than requests. Backpressure is natural:
``acquire()`` waits until the cluster may send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from raygen.distributed.leases import Lease, UsageReport
from raygen.distributed.provider_headers import pause_from_headers

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 1.0
"""Routine usage (completions, token corrections) waits this long for a lease call to ride on before it
is sent alone; 429s and pauses go at once. Shorter (0.25 s) under an in-flight cap, which only frees
capacity when completions are reported."""
_HEARTBEAT_S = 10.0
"""A worker holding slots or requests in flight reports at least this often, so the governor can tell it
is alive (a silent worker's reservations are freed after a minute)."""
_LOOKAHEAD_S = 0.5
"""A refill asks for about this much of the worker's recent demand beyond the callers already waiting."""
_OPEN_LEASE_FACTOR = 8
"""While the governor paces nothing, leases may be this many times ``lease_size``: fewer remote calls for a
run that never meets a limit (its slots go back at the first cut)."""
_RATIO_STEP = 0.2
"""Each reported usage moves the learned actual/estimate ratio a fifth of the way to what it saw."""
_RATIO_BOUNDS = (0.02, 50.0)
_FALLBACK_INTERVAL_S = 1.0
"""With the governor unreachable, a worker admits one request per this interval rather than stalling."""


class _Remote(Protocol):
    async def lease(
        self, holder: str, want_requests: int, want_tokens: float, report: UsageReport
    ) -> Lease: ...

    async def report(self, holder: str, report: UsageReport) -> Lease: ...


class _ActorRemote:
    """Adapts a Ray actor handle to the awaitable ``_Remote`` interface. If the actor died (e.g. with the
    process that owned it) and ``resolve`` is given, the governor is looked up (or re-created) by name
    once and the call retried."""

    def __init__(self, handle: Any, resolve: Callable[[], Any] | None = None):
        self._handle = handle
        self._resolve = resolve

    async def lease(self, holder: str, want_requests: int, want_tokens: float, report: UsageReport) -> Lease:
        return await self._call("lease", holder, want_requests, want_tokens, report)

    async def report(self, holder: str, report: UsageReport) -> Lease:
        return await self._call("report", holder, report)

    async def _call(self, method: str, *args: Any) -> Lease:
        try:
            return await getattr(self._handle, method).remote(*args)
        except ray.exceptions.RayActorError:
            if self._resolve is None:
                raise
            self._handle = self._resolve()
            return await getattr(self._handle, method).remote(*args)


@dataclass
class _Permit:
    epoch: int
    charged_tokens: float
    estimated_tokens: int = 0
    """The caller's own estimate, before the learned correction."""
    released: bool = False


@dataclass
class _LocalLease:
    left: int
    tokens_per_request: float
    epoch: int
    expires_at: float


@dataclass
class _Waiter:
    future: asyncio.Future
    since: float
    raw_tokens: int
    """The caller's own estimate; the learned ratio is applied when a lease is asked for."""


class GovernorClient:
    """``RateGate`` backed by a governor: one per worker process and event loop, shared by its sessions.

    Permits come from local leases; when callers wait (or the last slot goes) one refill is in flight at a
    time, sized to the waiters plus ~0.5 s of recent demand (at most ``lease_size``). Unused slots expire
    after the lease's TTL and go back. Usage is reported in batches; a 429 or Retry-After is sent at once
    and pauses this worker immediately (other workers learn of the pause on their next call).
    """

    def __init__(
        self,
        governor: Any,
        *,
        lease_size: int = 8,
        max_pause_s: float = 120.0,
        lookahead: bool = True,
        report_interval_s: float = REPORT_INTERVAL_S,
        holder: str | None = None,
        resolve: Callable[[], Any] | None = None,
    ):
        # ``governor``: the GovernorService actor's handle, or an in-process GovernorService (tests).
        self._remote: _Remote = (
            _ActorRemote(governor, resolve) if isinstance(governor, ray.actor.ActorHandle) else governor
        )
        self._lease_size = lease_size
        # The governor caps a cluster pause at max_pause_s; this worker's own pause obeys the same cap, so
        # one absurd Retry-After (100000 s) cannot freeze every session of the process.
        self._max_pause_s = max_pause_s
        # Leasing ahead of demand would hold in-flight capacity idle; off when an in-flight cap is set.
        self._lookahead = lookahead
        self._report_interval_s = report_interval_s
        self._holder = holder or _default_holder()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leases: deque[_LocalLease] = deque()
        self._waiters: deque[_Waiter] = deque()
        self._pending = UsageReport()
        self._pending_since: float | None = None
        self._in_flight = 0
        self._pause_until = 0.0
        self._last_contact = 0.0
        self._refill: asyncio.Task | None = None
        self._flush_task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._recent: deque[float] = deque(maxlen=256)  # acquire times, for the demand estimate
        self._recent_tokens: deque[int] = deque(maxlen=64)
        self._fresh_demand = False  # a caller came since the last refill: only then lease ahead
        self._failures = 0
        self._paced = True  # until the governor says otherwise
        self._token_ratio = 1.0  # actual tokens / estimated tokens, learned from reported usage
        self._ratio_samples = 0
        self._closed = False
        self.stats = {"permits": 0, "remote_calls": 0, "wait_s": 0.0, "returned": 0, "rate_limited": 0}
        """Counters of this gate: permits handed out, remote calls made, time callers waited."""

    # ---------------------------------------------------------------- RateGate

    async def acquire(self, est_tokens: int) -> _Permit:
        """Wait until the cluster may send a request of about ``est_tokens`` tokens; returns a permit for
        ``release``. Cancelling the wait gives the slot back."""
        loop = self._bind()
        if self._closed:
            raise RuntimeError("GovernorClient is closed")
        now = loop.time()
        raw = max(0, int(est_tokens))
        self._recent.append(now)
        self._recent_tokens.append(raw)
        self._fresh_demand = True
        waiter = _Waiter(loop.create_future(), now, raw)
        self._waiters.append(waiter)
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._give_back(waiter.future.result())
            raise

    def release(
        self,
        permit: Any,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        status: int | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Report how the request went; 429s and pauses are forwarded to the governor at once."""
        if not isinstance(permit, _Permit) or permit.released:
            return
        permit.released = True
        self._in_flight -= 1
        report = self._pending
        report.completed += 1
        used = prompt_tokens + completion_tokens
        if used <= 0:
            # No usage: a request that got through (or timed out, maybe after being served) keeps its
            # estimate; one the provider refused consumed nothing.
            used = permit.charged_tokens if status is None or status == 200 else 0
        elif permit.estimated_tokens > 0:
            # Learn how far estimates are off (a 512-token max_tokens allowance for a 50-token answer):
            # charging the estimate and refunding later would hold a token limit at the estimate's rate.
            seen = min(_RATIO_BOUNDS[1], max(_RATIO_BOUNDS[0], used / permit.estimated_tokens))
            step = _RATIO_STEP if self._ratio_samples else 1.0  # the first answer replaces the guess
            self._token_ratio += step * (seen - self._token_ratio)
            self._ratio_samples += 1
        report.token_adjust += used - permit.charged_tokens
        report.tokens_used += int(used)
        if status == 429:
            report.rate_limited += 1
            report.rate_limited_epoch = max(report.rate_limited_epoch, permit.epoch)
            self.stats["rate_limited"] += 1
            # The slots held with it belong to the rate that drew the 429: back they go, so the retry
            # (after the provider's Retry-After, often tens of ms) asks the governor, which has this
            # report by then, instead of going out on an old slot. With nothing paced yet a worker holds
            # up to 64 such slots, and its retries drew a second wave of 429s (7 of a run's 23).
            self._return_slots(lambda lease: lease.epoch <= permit.epoch)
        elif status is None or status >= 500:
            report.errors += 1
        # The reset headers are only a reason to pause once the provider refused. On a 200 they say
        # "this was the window's last request", which the governor's own pacing already knows; pausing
        # the whole cluster until the reset then wasted up to a second of every window (measured: 83%
        # of a known limit used; bench/README.md has the figures since).
        # A 429's Retry-After is the provider's own answer to "when may I send again"; its reset headers
        # say when the whole allowance is back (a sliding window's reset is a full window away), so they
        # are the fallback when it gives no Retry-After.
        header_pause = pause_from_headers(headers) if status == 429 and retry_after_s is None else 0.0
        pause = min(max(retry_after_s or 0.0, header_pause), self._max_pause_s)
        if pause > 0:
            report.pause_s = max(report.pause_s, pause)
        report.in_flight = self._in_flight
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        if pause > 0:
            self._pause_until = max(self._pause_until, now + pause)
        self._note_pending()
        if status == 429 or pause > 0:
            self._start_flush()
        self._wake()

    # ---------------------------------------------------------------- lifecycle

    @property
    def closed(self) -> bool:
        return self._closed

    async def flush(self) -> None:
        """Send pending usage now and wait until it is delivered (or has failed)."""
        self._bind()
        self._start_flush()
        while self._flush_task is not None:
            await asyncio.shield(self._flush_task)

    async def aclose(self) -> None:
        """Return unused slots, send the last report and stop timers. Waiting callers get an error."""
        if self._loop is None:
            return
        self._closed = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(RuntimeError("GovernorClient closed"))
        self._waiters.clear()
        self._return_slots(lambda lease: True)
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refill
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()

    # ---------------------------------------------------------------- internals

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a GovernorClient serves one event loop; make one per loop")
        return loop

    def _dispatch(self) -> None:
        """Serve waiters from local slots, start a refill if needed, re-arm the timer."""
        now = self._loop.time()
        self._return_slots(lambda lease: lease.expires_at <= now)
        if now >= self._pause_until:
            while self._waiters and self._leases:
                waiter = self._waiters.popleft()
                if waiter.future.done():  # cancelled while waiting
                    continue
                lease = self._leases[0]
                lease.left -= 1
                if lease.left == 0:
                    self._leases.popleft()
                self._in_flight += 1
                self.stats["permits"] += 1
                waited = now - waiter.since
                self.stats["wait_s"] += waited
                self._pending.wait_s += waited
                self._pending.in_flight = self._in_flight
                waiter.future.set_result(_Permit(lease.epoch, lease.tokens_per_request, waiter.raw_tokens))
            while self._waiters and self._waiters[0].future.done():
                self._waiters.popleft()
            if self._refill is None and not self._closed and self._want(now)[0] > 0:
                self._refill = asyncio.ensure_future(self._refill_once())
        self._wake()

    def _want(self, now: float) -> tuple[int, float]:
        """Slots to ask for: every caller not covered by local slots and, when the slots are (nearly) gone,
        about ``_LOOKAHEAD_S`` of the last second's demand, at most ``lease_size``; and their tokens."""
        slots = sum(lease.left for lease in self._leases)
        waiting = [w for w in self._waiters if not w.future.done()]
        unserved = waiting[slots:]
        spare = max(0, slots - len(waiting))
        ahead = 0
        if self._lookahead and self._fresh_demand and spare <= 1:
            recent = sum(1 for t in self._recent if now - t <= 1.0)
            ahead = math.ceil(recent * _LOOKAHEAD_S) - spare
        count = min(self._lease_size * (1 if self._paced else _OPEN_LEASE_FACTOR), max(len(unserved), ahead))
        if count <= 0:
            return 0, 0.0
        # Raw estimates times the ratio learned so far: the first answers correct every estimate at once,
        # those of callers already waiting and of the recent demand too. (Taken as they were when the
        # callers came, a 512-token allowance for ~180-token calls held a known tpm limit at half pace
        # for the first ~3 s, until the 64 recent estimates had turned over.)
        ratio = self._token_ratio
        avg = ratio * sum(self._recent_tokens) / len(self._recent_tokens) if self._recent_tokens else 0.0
        tokens = sum(w.raw_tokens * ratio for w in unserved[:count]) + max(0, count - len(unserved)) * avg
        return count, float(tokens)

    async def _refill_once(self) -> None:
        try:
            want, tokens = self._want(self._loop.time())
            if want <= 0 or self._closed:
                return
            report = self._take_pending()
            self._fresh_demand = False
            self.stats["remote_calls"] += 1
            try:
                lease = await self._remote.lease(self._holder, want, tokens, report)
            except asyncio.CancelledError:
                self._restore_pending(report)
                raise
            except Exception as exc:  # the governor is unreachable: degrade, do not stall sessions
                self._restore_pending(report)
                self._failures += 1
                if self._failures in (1, 10) or self._failures % 100 == 0:
                    log.warning("rate governor unreachable (%s); admitting 1 request/s locally", exc)
                await asyncio.sleep(_FALLBACK_INTERVAL_S)
                lease = Lease(requests=1, epoch=-1, ttl_s=_FALLBACK_INTERVAL_S)
            else:
                self._failures = 0
            self._absorb(lease)
        finally:
            self._refill = None
        if not self._closed:
            self._dispatch()

    def _absorb(self, lease: Lease) -> None:
        now = self._loop.time()
        self._last_contact = now
        if lease.epoch >= 0:
            self._paced = lease.paced
        if lease.epoch >= 0 and any(held.epoch < lease.epoch for held in self._leases):
            # The target was cut since these slots were granted: they belong to the rate that drew 429s.
            self._return_slots(lambda held: held.epoch < lease.epoch)
        if lease.pause_s > 0:
            self._pause_until = max(self._pause_until, now + lease.pause_s)
        if lease.requests > 0:
            self._leases.append(
                _LocalLease(lease.requests, lease.tokens_per_request, lease.epoch, now + lease.ttl_s)
            )

    def _give_back(self, permit: _Permit) -> None:
        if permit.released:
            return
        permit.released = True
        self._in_flight -= 1
        self._pending.returned += 1
        self._pending.token_adjust -= permit.charged_tokens
        self._pending.in_flight = self._in_flight
        self.stats["returned"] += 1
        self._note_pending()

    def _return_slots(self, which: Any) -> None:
        kept: deque[_LocalLease] = deque()
        for lease in self._leases:
            if which(lease):
                self._pending.returned += lease.left
                self._pending.token_adjust -= lease.left * lease.tokens_per_request
                self.stats["returned"] += lease.left
                self._note_pending()
            else:
                kept.append(lease)
        self._leases = kept

    def _note_pending(self) -> None:
        if self._loop is not None and self._pending_since is None:
            self._pending_since = self._loop.time()

    def _take_pending(self) -> UsageReport:
        report, self._pending = self._pending, UsageReport()
        self._pending_since = None
        return report

    def _restore_pending(self, report: UsageReport) -> None:
        self._pending.merge(report)
        if not report.is_empty():
            self._note_pending()

    def _start_flush(self) -> None:
        if self._flush_task is None and self._loop is not None:
            self._flush_task = asyncio.ensure_future(self._flush_loop())

    async def _flush_loop(self) -> None:
        try:
            while not self._pending.is_empty() or self._heartbeat_due():
                report = self._take_pending()
                self.stats["remote_calls"] += 1
                try:
                    reply = await self._remote.report(self._holder, report)
                except Exception as exc:  # keep the deltas for the next attempt
                    self._restore_pending(report)
                    log.warning("rate governor report failed: %s", exc)
                    break
                self._absorb(reply)
        finally:
            self._flush_task = None
        if not self._closed:
            self._dispatch()

    def _heartbeat_due(self) -> bool:
        holding = self._in_flight > 0 or bool(self._leases)
        return holding and self._loop.time() - self._last_contact >= _HEARTBEAT_S

    def _wake(self) -> None:
        """Arm one timer for the next thing due: lease expiry, end of a pause, a batched report, a
        heartbeat. No timer when nothing is pending."""
        if self._loop is None or self._closed:
            return
        now = self._loop.time()
        due: list[float] = [lease.expires_at for lease in self._leases]
        if self._waiters and now < self._pause_until:
            due.append(self._pause_until)
        if self._pending_since is not None:
            due.append(self._pending_since + self._report_interval_s)
        if self._in_flight > 0 or self._leases:
            due.append(self._last_contact + _HEARTBEAT_S)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due:
            self._timer = self._loop.call_at(max(min(due), now + 0.001), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._loop.time()
        if (self._pending_since is not None and now >= self._pending_since + self._report_interval_s) or (
            self._heartbeat_due()
        ):
            self._start_flush()
        self._dispatch()


def _default_holder() -> str:
    """A worker id unique across the cluster: Ray's worker id when inside Ray, else a random one."""
    import os
    import uuid

    try:
        if ray.is_initialized():
            return f"{ray.get_runtime_context().get_worker_id()[:16]}-{uuid.uuid4().hex[:6]}"
    except Exception:  # outside a Ray worker context
        pass
    return f"pid{os.getpid()}-{uuid.uuid4().hex[:8]}"
