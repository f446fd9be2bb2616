"""The run's control actor: the path each finished session takes to the driver, the memory of which
sessions finished, and the drain switch.

Why not Ray Data's output: a ``map_batches`` task returns its rows when the whole task ends (an async
UDF's generator is unrolled per batch, batches are re-ordered, and a task's rows are built into one
block), so one slow session held back every finished record of its task, for minutes. A session actor
hands its record here as soon as the session ends (and keeps nothing of it); the driver takes records
from here within a fraction of a second and makes them durable (``output.durable_within_s``).

Why it remembers finished sessions: when an actor dies, Ray Data re-runs its whole task, sessions that
had already finished included. An actor asks before each session, and a session that finished
in this run (its record handed over) is skipped instead of being paid for twice. The same question
carries the drain: once ``drain`` was called no session starts. Both travel in one ``exchange`` call per
actor about every 0.1 s (``control_link.py``): a call per session cost about 1 ms of CPU on
each side, a tenth of what a whole session costs.

One per pass, created by the driver with no CPU reservation on the driver's node; it dies with the
driver (records it holds then were not durable yet: at most the last fraction of a second).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, cast

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# Records waiting for the driver beyond which no new session may start (the driver is writing slowly).
# Records themselves are always taken: a record left in its actor would die with it and be paid again.
_QUEUE_RECORDS = 1024
_TAKE_EVERY_S = 0.1
"""The driver takes records at most this often: each call costs both processes ~0.5-2 ms of CPU here
whatever it carries, and at hundreds of sessions a second a driver taking as fast as it could made a call
per few records (bench ``ceiling``). A record waits that much longer, within ``output.durable_within_s``
(see ``control_link.LINGER_S``)."""

Finished = tuple[str, int, str, str]
"""A session that ended: (sample key, attempt, record JSON, summary JSON)."""


class RunControl:
    def __init__(self) -> None:
        self._records: deque[tuple[str, str]] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._finished: set[tuple[str, int]] = set()
        self._running: dict[tuple[str, int], float] = {}
        self._draining = False
        self.skipped = 0
        self._last_take = 0.0

    async def exchange(
        self, finished: list[Finished], released: list[tuple[str, int]], begins: list[tuple[str, int]]
    ) -> tuple[list[str], bool]:
        """One session actor's news since its last call (``control_link.ControlLink`` batches them, so a
        busy actor makes tens of calls a second, not two per session): sessions that ended, sessions
        that were told to run but will not (the actor learned of the drain first), then samples about to
        start. Returns, for each of ``begins``, whether it may start: ``run``, or why not: ``finished``
        (in this run already) or ``draining`` (and so will every later one be); and whether the run
        drains. While more than ``_QUEUE_RECORDS`` records wait for the driver, the answers wait."""
        for sample_key, attempt, record_json, summary_json in finished:
            key = (sample_key, attempt)
            self._finished.add(key)
            # Queued before it stops counting as running: a drain that sees nothing running then finds
            # every finished record in the queue.
            self._records.append((record_json, summary_json))
            self._running.pop(key, None)
        if finished:
            self._arrived.set()
            if len(self._records) >= _QUEUE_RECORDS:
                self._room.clear()
        for key in released:
            self._running.pop(key, None)
        if begins:
            await self._room.wait()
        return [self._begin(key) for key in begins], self._draining

    def _begin(self, key: tuple[str, int]) -> str:
        if self._draining or key in self._finished:
            self.skipped += 1
            # Asked again after its actor died: whoever was told to run it is gone.
            self._running.pop(key, None)
            return "draining" if self._draining else "finished"
        self._running[key] = time.monotonic()
        return "run"

    async def take(self, wait_s: float) -> list[tuple[str, str]]:
        """Every record waiting, after waiting up to ``wait_s`` for the first one (and at least until
        ``_TAKE_EVERY_S`` after the previous take)."""
        early = self._last_take + _TAKE_EVERY_S - time.monotonic()
        if early > 0:
            await asyncio.sleep(early)
        self._last_take = time.monotonic()
        if not self._records:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=wait_s)
            except TimeoutError:
                return []
        out = list(self._records)
        self._records.clear()
        self._arrived.clear()
        self._room.set()
        return out

    async def drain(self) -> None:
        """From now on no session starts (those running finish)."""
        self._draining = True

    async def state(self) -> dict[str, Any]:
        """Sessions running (told to run, not finished: including samples waiting for a slot of their
        actor; a killed actor's stay until their task re-runs),
        finished, and skipped (told not to start)."""
        return {"running": len(self._running), "finished": len(self._finished), "skipped": self.skipped}


def start_control() -> ActorHandle:
    """A ``RunControl`` actor on this (the driver's) node, tied to this process's lifetime."""
    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(RunControl).options(
        num_cpus=0,
        max_concurrency=10_000,  # every session slot of every actor may call at once
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    )
    return cast(ActorHandle, actor.remote())  # Ray's stubs cannot tell a handle from the class
