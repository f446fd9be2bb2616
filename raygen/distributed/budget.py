"""The run's budget: one named Ray actor per run that every session on every node asks before each model
call (``--max-cost``, ``--max-tokens``; docs/cost.md).

Admission rule, per model call: a call is admitted only while what was spent plus what the calls in
flight reserved plus this call's reservation stays within the cap; a call that does not fit yet waits for
calls in flight to settle. The budget is reached when a call would not fit even with nothing in flight
(spent plus its reservation over the cap): that call and every later one are refused, so the run stops
instead of trickling on. What the calls in flight then spend beyond their reservations is the overshoot;
``BudgetLedger`` measures it and the upper bound it obeys.

And per session: a session's first call is admitted only if, besides, the sessions already open can
still spend what a finished session cost on average (less what each spent so far); until then it waits.
New sessions stop for good once one would not fit even with no other session open (spent plus the
average session over the cap), while the open ones go on: a budget is spent finishing sessions, not
cutting many short.

``BudgetLedger`` is the plain logic (tested without Ray); ``BudgetService`` is the actor's body;
``raygen.distributed.budget_client.BudgetClient`` is a session actor's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NAMESPACE = "raygen"
WAIT = -1
"""``BudgetLedger.reserve``'s answer for a call that fits once calls in flight settle."""
_RECHECK_S = 1.0
"""A waiting call re-checks at least this often (a reservation may have expired meanwhile)."""


@dataclass
class BudgetLedger:
    """Spend, reservations and the admission decision. Amounts in USD and tokens; a cap of None is no cap."""

    max_usd: float | None = None
    max_tokens: int | None = None
    spent_usd: float = 0.0
    """Settled spend, starting with what earlier invocations of the run recorded."""
    spent_tokens: int = 0
    reached: str = ""
    """Why admission ended (``""`` while it goes on)."""
    ttl_s: float = float("inf")
    """A reservation not settled after this long is dropped: its session actor died mid-call."""
    reserved: dict[int, tuple[float, int, float]] = field(default_factory=dict)
    """Calls in flight: ticket -> (USD, tokens) reserved, and when."""
    expired: int = 0
    excess_usd: float = 0.0
    """Sum over settled calls of what each cost beyond its reservation: an upper bound on the overshoot."""
    excess_tokens: int = 0
    admitted: int = 0
    refused: int = 0
    max_in_flight: int = 0
    in_flight_at_stop: int = 0
    """Calls in flight when admission ended: what could still spend past the cap."""
    sessions_closed: str = ""
    """Why new sessions stopped being admitted (``""`` while they are)."""
    open: dict[str, list[float]] = field(default_factory=dict)
    """Sessions that made a call and have not ended: session -> [USD, tokens] spent so far, last call."""
    done: list[float] = field(default_factory=lambda: [0, 0.0, 0])
    """Ended sessions that made a call: [count, USD, tokens]."""
    _ticket_session: dict[int, str] = field(default_factory=dict)
    _tickets: Any = field(default_factory=lambda: itertools.count(1))

    def reserve(self, usd: float, tokens: int, now: float = 0.0, session: str | None = None) -> int | None:
        """A ticket for a call of about ``usd`` and ``tokens`` of ``session``; ``WAIT`` when it fits only
        once calls in flight settle; None when the budget is reached (or, for a session's first call, when
        new sessions stopped)."""
        if session is not None and session not in self.open and not self.reached:
            if not self.sessions_closed:
                self.sessions_closed = self._over(*self._session_alone(usd, tokens), in_flight=False)
            if self.sessions_closed:
                self.refused += 1
                return None
            if self._over_with_open(usd, tokens):
                return WAIT
        if not self.reached:
            self.reached = self._over(usd, tokens, in_flight=False)
            if self.reached:
                self.in_flight_at_stop = len(self.reserved)
        if self.reached:
            self.refused += 1
            return None
        if self._over(usd, tokens, in_flight=True):
            return WAIT
        ticket = next(self._tickets)
        self.reserved[ticket] = (usd, tokens, now)
        if session is not None:
            self.open.setdefault(session, [0.0, 0, now])[2] = now
            self._ticket_session[ticket] = session
        self.admitted += 1
        self.max_in_flight = max(self.max_in_flight, len(self.reserved))
        return ticket

    def _over(self, usd: float, tokens: int, *, in_flight: bool) -> str:
        held_usd = sum(r[0] for r in self.reserved.values()) if in_flight else 0.0
        held_tokens = sum(r[1] for r in self.reserved.values()) if in_flight else 0
        if self.max_usd is not None and self.spent_usd + held_usd + usd > self.max_usd:
            return "cost"
        if self.max_tokens is not None and self.spent_tokens + held_tokens + tokens > self.max_tokens:
            return "tokens"
        return ""

    def _session_alone(self, usd: float, tokens: int) -> tuple[float, int]:
        """What a new session may spend: an average finished one (at least its first call's reservation)."""
        count, done_usd, done_tokens = self.done
        if not count:
            return usd, tokens
        return max(usd, done_usd / count), int(max(tokens, done_tokens / count))

    def _over_with_open(self, usd: float, tokens: int) -> str:
        """Whether a new session's first call would leave the open sessions less than a finished session
        spends on average (nothing is held back before a session has finished)."""
        count, done_usd, done_tokens = self.done
        if not count:
            return ""
        need_usd = sum(max(0.0, done_usd / count - spent[0]) for spent in self.open.values())
        need_tokens = sum(max(0.0, done_tokens / count - spent[1]) for spent in self.open.values())
        return self._over(usd + need_usd, int(tokens + need_tokens), in_flight=True)

    def end_session(self, session: str) -> None:
        """``session`` ended: what it spent becomes part of the average a new session is judged by."""
        spent = self.open.pop(session, None)
        if spent is not None:
            self.done[0] += 1
            self.done[1] += spent[0]
            self.done[2] += spent[1]

    def expire(self, now: float) -> None:
        """Drop reservations older than ``ttl_s`` (their calls' cost is never known), and sessions whose last
        call is that old."""
        for ticket in [t for t, r in self.reserved.items() if now - r[2] > self.ttl_s]:
            del self.reserved[ticket]
            self.expired += 1
        for session in [s for s, spent in self.open.items() if now - spent[2] > self.ttl_s]:
            del self.open[session]  # its actor died: it holds no room for calls it will never make

    def settle(self, ticket: int | None, usd: float, tokens: int) -> None:
        """The call of ``ticket`` cost ``usd`` and ``tokens`` (an unknown or None ticket still counts)."""
        held = self.reserved.pop(ticket, None) if ticket is not None else None
        reserved_usd, reserved_tokens, _ = held or (usd, tokens, 0.0)
        session = self._ticket_session.pop(ticket, None) if ticket is not None else None
        if session is not None and session in self.open:
            self.open[session][0] += usd
            self.open[session][1] += tokens
        self.spent_usd += usd
        self.spent_tokens += tokens
        self.excess_usd += max(0.0, usd - reserved_usd)
        self.excess_tokens += max(0, tokens - reserved_tokens)

    def snapshot(self) -> dict[str, Any]:
        """Spend, caps, whether and why admission ended, and the overshoot with its measured bound."""
        over_usd = self.spent_usd - self.max_usd if self.max_usd is not None else 0.0
        over_tokens = self.spent_tokens - self.max_tokens if self.max_tokens is not None else 0
        return {
            "max_usd": self.max_usd,
            "max_tokens": self.max_tokens,
            "spent_usd": self.spent_usd,
            "spent_tokens": self.spent_tokens,
            "reached": self.reached or self.sessions_closed,
            "sessions_closed": self.sessions_closed,
            "open_sessions": len(self.open),
            "in_flight": len(self.reserved),
            "reserved_usd": sum(r[0] for r in self.reserved.values()),
            "admitted": self.admitted,
            "refused": self.refused,
            "max_in_flight": self.max_in_flight,
            "expired": self.expired,
            "in_flight_at_stop": self.in_flight_at_stop,
            "overshoot_usd": max(0.0, over_usd),
            "overshoot_tokens": max(0, over_tokens),
            "excess_usd": self.excess_usd,
            "excess_tokens": self.excess_tokens,
        }


class BudgetService:
    """The actor's body: ``BudgetLedger`` behind remote calls (one event loop, so no locks); a call that
    must wait for room waits here, woken by each settlement."""

    def __init__(self, max_usd: float | None, max_tokens: int | None, spent: tuple[float, int], ttl_s: float):
        self.ledger = BudgetLedger(max_usd, max_tokens, spent[0], spent[1], ttl_s=ttl_s)
        self._settled = asyncio.Event()

    async def reserve(self, usd: float, tokens: int, session: str | None = None) -> int | None:
        while True:
            now = time.monotonic()
            self.ledger.expire(now)
            ticket = self.ledger.reserve(usd, tokens, now, session)
            if ticket != WAIT:
                return ticket
            self._settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), _RECHECK_S)

    async def settle(self, ticket: int | None, usd: float, tokens: int) -> None:
        self.ledger.settle(ticket, usd, tokens)
        self._settled.set()

    async def end_session(self, session: str) -> None:
        self.ledger.end_session(session)
        self._settled.set()

    async def snapshot(self) -> dict[str, Any]:
        return self.ledger.snapshot()


def budget_name(run_name: str) -> str:
    return f"raygen-budget-{run_name}"


def start_budget(
    run_name: str, max_usd: float | None, max_tokens: int | None, spent: tuple[float, int], ttl_s: float
) -> Any:
    """Create the run's budget actor (driver only, so it lives as long as the run; on the driver's node,
    no CPU). Not restarted: a budget that forgot its spend would admit past the cap; a session that finds
    it gone fails with ``budget_reached`` and the run stops. ``spent``: USD and tokens of earlier
    invocations; ``ttl_s``: how long a call may stay unsettled (``BudgetLedger.ttl_s``)."""
    node = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(BudgetService)
        .options(
            name=budget_name(run_name),
            namespace=NAMESPACE,
            num_cpus=0,
            max_restarts=0,
            max_concurrency=10_000,  # every session slot of every actor may ask at once
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(max_usd, max_tokens, spent, ttl_s)
    )


def budget_snapshot(actor: Any) -> dict[str, Any]:
    return ray.get(actor.snapshot.remote())
