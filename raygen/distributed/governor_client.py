"""The worker side of the rate governor: ``GovernorClient``, one per worker process and event loop.

It implements ``raygen.model.gate.RateGate`` for every session in the process: permits come from small
leases taken from the cluster's ``GovernorService`` (raygen.distributed.governor), and usage goes back in
batched reports, so a busy worker makes far fewer remote calls than requests. Backpressure is natural:
``acquire()`` waits until the cluster may send, and that wait is not counted against the session's
``session_timeout_s`` (raygen.model.gate_hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable

from ray.actor import ActorHandle

from raygen.distributed.client_usage import DemandMeter, LocalLease, PendingUsage, Permit, TokenRatio, Waiter
from raygen.distributed.governor_remote import GovernorRemote, as_remote, default_holder
from raygen.distributed.leases import Lease
from raygen.distributed.provider_headers import pause_from_headers
from raygen.distributed.refusals import Refusal, RefusalEvidence
from raygen.model import gate_hold
from raygen.model.gate import Permit as GatePermit

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 1.0
"""Routine usage (completions, token corrections) waits this long for a lease call to ride on before it
is sent alone; refusals go at once. Shorter (0.25 s) under an in-flight cap, which only frees capacity
when completions are reported."""
_HEARTBEAT_S = 10.0
"""A worker holding slots or requests in flight reports at least this often, so the governor can tell it
is alive (a silent worker's reservations are freed after a minute)."""
_LOOKAHEAD_S = 0.5
"""A refill asks for about this much of the worker's recent demand beyond the callers already waiting, so
a busy worker makes about two lease calls a second whatever its request rate (the governor grants at most
one pacing burst of a known limit, so pacing stays as fine as ``burst_s``). A fixed count per lease made
the calls grow with the rate: 8 a lease at 1,400 requests/s was 175 calls/s from one worker, and a Ray
call costs each side ~1-2 ms of CPU here (bench ``ceiling``)."""
_FALLBACK_INTERVAL_S = 1.0
"""With the governor unreachable, a worker admits one request per this interval rather than stalling."""


class GovernorClient:
    """``RateGate`` backed by a governor: one per worker process and event loop, shared by its sessions.

    Permits come from local leases; when callers wait (or the last slot goes) one refill is in flight at a
    time, sized to the waiters plus ~0.5 s of recent demand (at most ``lease_size``, if set). Unused slots
    expire after the lease's TTL and go back. Usage is reported in batches; a refusal (429, or an answer
    asking to wait) is sent at once. One refusal delays only its own request (the model client's retry); this
    worker pauses on its own only when its refusals are evidence (raygen.distributed.refusals), and every
    worker pauses when the governor's reply says the cluster's are.
    """

    def __init__(
        self,
        governor: ActorHandle | GovernorRemote,
        *,
        lease_size: int | None = None,
        max_pause_s: float = 120.0,
        lookahead: bool = True,
        report_interval_s: float = REPORT_INTERVAL_S,
        holder: str | None = None,
        resolve: Callable[[], ActorHandle] | None = None,
    ):
        # ``governor``: the GovernorService actor's handle, or an in-process GovernorService (tests).
        self._remote = as_remote(governor, resolve)
        self._lease_size = lease_size
        # The governor caps a cluster pause at max_pause_s; this worker's own pause obeys the same cap.
        self._max_pause_s = max_pause_s
        # Leasing ahead of demand would hold in-flight capacity idle; off when an in-flight cap is set.
        self._lookahead = lookahead
        self._report_interval_s = report_interval_s
        self._holder = holder or default_holder()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leases: deque[LocalLease] = deque()
        self._waiters: deque[Waiter] = deque()
        self._pending = PendingUsage()
        self._refusals = RefusalEvidence()
        self._in_flight = 0
        self._pause_until = 0.0
        self._last_contact = 0.0
        self._refill: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._demand = DemandMeter()
        self._recent_tokens: deque[int] = deque(maxlen=64)
        self._fresh_demand = False  # a caller came since the last refill: only then lease ahead
        self._failures = 0
        self._token_ratio = TokenRatio()
        self._closed = False
        self.stats = {"permits": 0, "remote_calls": 0, "wait_s": 0.0, "returned": 0, "rate_limited": 0}
        """Counters of this gate: permits handed out, remote calls made, time callers waited."""

    # ---------------------------------------------------------------- RateGate

    async def acquire(self, est_tokens: int) -> Permit:
        """Wait until the cluster may send a request of about ``est_tokens`` tokens; returns a permit for
        ``release``. Cancelling the wait gives the slot back. The session's timeout stops meanwhile."""
        loop = self._bind()
        if self._closed:
            raise RuntimeError("GovernorClient is closed")
        now = loop.time()
        raw = max(0, int(est_tokens))
        self._demand.add(now)
        self._recent_tokens.append(raw)
        self._fresh_demand = True
        waiter = Waiter(loop.create_future(), now, raw)
        self._waiters.append(waiter)
        self._dispatch()
        if waiter.future.done():  # served from a local slot at once: no hold to account for
            return waiter.future.result()
        try:
            with gate_hold.held():
                return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._give_back(waiter.future.result())
            raise

    def release(
        self,
        permit: GatePermit,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        status: int | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Report how the request went; refusals are forwarded to the governor at once."""
        if not isinstance(permit, Permit) or permit.released:
            return
        permit.released = True
        self._in_flight -= 1
        self._pending.settle(permit, prompt_tokens + completion_tokens, status, self._token_ratio)
        if status == 429:
            self.stats["rate_limited"] += 1
            # The slots held with it belong to the rate that drew the 429: back they go, so the retry
            # (after the provider's Retry-After, often tens of ms) asks the governor, which has this
            # report by then, instead of going out on an old slot. With nothing paced yet a worker holds
            # up to 64 such slots, and its retries drew a second wave of 429s (7 of a run's 23).
            self._return_slots(lambda lease: lease.epoch <= permit.epoch)
        asked = _asked_pause_s(status, retry_after_s, headers)
        self._pending.report.in_flight = self._in_flight
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        refused = status == 429 or asked > 0
        if refused:
            self._pending.report.refusals.append((asked, status == 429, now - permit.granted_at))
            self._refusals.add(Refusal(now, asked, status == 429))
            local_pause = self._refusals.pause_s(now, self._max_pause_s)
            if local_pause > 0:
                self._pause_until = max(self._pause_until, now + local_pause)
        self._pending.note(now)
        if refused:
            self._start_flush()
        self._wake()

    # ---------------------------------------------------------------- lifecycle

    @property
    def closed(self) -> bool:
        return self._closed

    async def flush(self) -> None:
        """Send pending usage now and wait until it is delivered (or has failed).

        A lease request in flight carries the report taken with it (refusals included), so it is waited
        for too: without that, a caller that flushed and then asked the governor could find its 429s
        not yet counted.
        """
        self._bind()
        refill = self._refill
        self._start_flush()
        if refill is not None:
            await asyncio.wait([refill])
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

    # ---------------------------------------------------------------- internals: serving callers

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a GovernorClient serves one event loop; make one per loop")
        return loop

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _dispatch(self) -> None:
        """Serve waiters from local slots, start a refill if needed, re-arm the timer."""
        now = self._now()
        self._return_slots(lambda lease: lease.expires_at <= now)
        if now >= self._pause_until:
            while self._waiters and self._leases:
                waiter = self._waiters.popleft()
                if not waiter.future.done():  # else cancelled while waiting
                    self._serve(waiter, now)
            while self._waiters and self._waiters[0].future.done():
                self._waiters.popleft()
            if self._refill is None and not self._closed and self._want(now)[0] > 0:
                self._refill = asyncio.ensure_future(self._refill_once())
        self._wake()

    def _serve(self, waiter: Waiter, now: float) -> None:
        lease = self._leases[0]
        lease.left -= 1
        if lease.left == 0:
            self._leases.popleft()
        self._in_flight += 1
        self.stats["permits"] += 1
        waited = now - waiter.since
        self.stats["wait_s"] += waited
        self._pending.report.wait_s += waited
        self._pending.report.in_flight = self._in_flight
        waiter.future.set_result(Permit(lease.epoch, lease.tokens_per_request, waiter.raw_tokens, now))

    def _want(self, now: float) -> tuple[int, float]:
        """Slots to ask for: every caller not covered by local slots and, when the slots are (nearly) gone,
        about ``_LOOKAHEAD_S`` of the last second's demand (at most ``lease_size``, if set); and their
        tokens."""
        slots = sum(lease.left for lease in self._leases)
        waiting = [w for w in self._waiters if not w.future.done()]
        unserved = waiting[slots:]
        spare = max(0, slots - len(waiting))
        ahead = 0
        if self._lookahead and self._fresh_demand and spare <= 1:
            ahead = math.ceil(self._demand.per_s(now) * _LOOKAHEAD_S) - spare
        count = max(len(unserved), ahead)
        if self._lease_size is not None:
            count = min(count, self._lease_size)
        if count <= 0:
            return 0, 0.0
        # Raw estimates times the ratio learned so far: the first answers correct every estimate at once,
        # those of callers already waiting and of the recent demand too. (Taken as they were when the
        # callers came, a 512-token allowance for ~180-token calls held a known tpm limit at half pace
        # for the first ~3 s, until the 64 recent estimates had turned over.)
        ratio = self._token_ratio.value
        avg = ratio * sum(self._recent_tokens) / len(self._recent_tokens) if self._recent_tokens else 0.0
        tokens = sum(w.raw_tokens * ratio for w in unserved[:count]) + max(0, count - len(unserved)) * avg
        return count, float(tokens)

    async def _refill_once(self) -> None:
        try:
            want, tokens = self._want(self._now())
            if want <= 0 or self._closed:
                return
            report = self._pending.take()
            self._fresh_demand = False
            self.stats["remote_calls"] += 1
            try:
                lease = await self._remote.lease(self._holder, want, tokens, report)
            except asyncio.CancelledError:
                self._pending.restore(report, self._now())
                raise
            except Exception as exc:  # the governor is unreachable: degrade, do not stall sessions
                self._pending.restore(report, self._now())
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
        now = self._now()
        self._last_contact = now
        if lease.epoch >= 0 and any(held.epoch < lease.epoch for held in self._leases):
            # The target was cut since these slots were granted: they belong to the rate that drew 429s.
            self._return_slots(lambda held: held.epoch < lease.epoch)
        if lease.pause_s > 0:
            self._pause_until = max(self._pause_until, now + lease.pause_s)
        if lease.requests > 0:
            self._leases.append(
                LocalLease(lease.requests, lease.tokens_per_request, lease.epoch, now + lease.ttl_s)
            )

    def _give_back(self, permit: Permit) -> None:
        if permit.released:
            return
        permit.released = True
        self._in_flight -= 1
        self._pending.give_back(permit)
        self._pending.report.in_flight = self._in_flight
        self.stats["returned"] += 1
        self._pending.note(self._now())

    def _return_slots(self, which: Callable[[LocalLease], bool]) -> None:
        kept: deque[LocalLease] = deque()
        for lease in self._leases:
            if which(lease):
                self._pending.return_slots(lease)
                self.stats["returned"] += lease.left
                self._pending.note(self._now())
            else:
                kept.append(lease)
        self._leases = kept

    # ---------------------------------------------------------------- internals: reports and timers

    def _start_flush(self) -> None:
        if self._flush_task is None and self._loop is not None:
            self._flush_task = asyncio.ensure_future(self._flush_loop())

    async def _flush_loop(self) -> None:
        try:
            while not self._pending.report.is_empty() or self._heartbeat_due():
                report = self._pending.take()
                self.stats["remote_calls"] += 1
                try:
                    reply = await self._remote.report(self._holder, report)
                except Exception as exc:  # keep the deltas for the next attempt
                    self._pending.restore(report, self._now())
                    log.warning("rate governor report failed: %s", exc)
                    break
                self._absorb(reply)
        finally:
            self._flush_task = None
        if not self._closed:
            self._dispatch()

    def _heartbeat_due(self) -> bool:
        holding = self._in_flight > 0 or bool(self._leases)
        return holding and self._now() - self._last_contact >= _HEARTBEAT_S

    def _wake(self) -> None:
        """Arm one timer for the next thing due: lease expiry, end of a pause, a batched report, a
        heartbeat. No timer when nothing is pending."""
        if self._loop is None or self._closed:
            return
        now = self._loop.time()
        due: list[float] = [lease.expires_at for lease in self._leases]
        if self._waiters and now < self._pause_until:
            due.append(self._pause_until)
        if self._pending.since is not None:
            due.append(self._pending.since + self._report_interval_s)
        if self._in_flight > 0 or self._leases:
            due.append(self._last_contact + _HEARTBEAT_S)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due:
            self._timer = self._loop.call_at(max(min(due), now + 0.001), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        since = self._pending.since
        if (since is not None and self._now() >= since + self._report_interval_s) or self._heartbeat_due():
            self._start_flush()
        self._dispatch()


def _asked_pause_s(status: int | None, retry_after_s: float | None, headers: dict[str, str] | None) -> float:
    """How long an answer asked to wait: its Retry-After; for a 429 without one, its rate-limit headers.

    On a 200 the reset headers say "this was the window's last request", which the governor's own pacing
    already knows: pausing until the reset then wasted up to a second of every window (83% of a known
    limit used). A 429's reset headers say when the whole allowance is back (a sliding window's reset is a
    full window away), so they are only the fallback when it gives no Retry-After."""
    if retry_after_s is not None and status != 200:
        return max(0.0, retry_after_s)
    return pause_from_headers(headers) if status == 429 else 0.0
