"""A session actor's side of the control actor (``control.py``): its questions and records, batched.

Asking the control actor before each session and handing it each record were two Ray calls per session,
about 1 ms of CPU on each side: a tenth of a whole session's cost at 200 ms model latency. Here one
``exchange`` call carries everything that piled up while the previous call was out, plus what arrives in
the next ``LINGER_S``; a busy actor makes a few dozen calls a second whatever its session rate.

A record's hand-over is still awaited before its session's batch reports back to Ray Data, so a batch
that Ray Data sees end has every record with the control actor, as before.

Samples ask before a slot is free (``worker.py``), so the answer ``run`` may be old when the session
starts. A drain is learned from any reply, and an actor with nothing to send still asks every
``POLL_S``, so a session may start at most ~``POLL_S + LINGER_S`` plus a round trip after the drain
began (samples wait for slots while long sessions run, possibly for minutes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.actor import ActorHandle

from raygen.distributed.control import Finished

LINGER_S = 0.1
"""How long a call waits for company. A session start waits up to this much longer (0.1 s of a
session of seconds); a record reaches the driver that much later (within ``output.durable_within_s``:
the sink writes a record when it is half that old, and the trip here plus the driver's take is ~0.25 s at
most). Each call costs the control actor ~0.5-2 ms of CPU on this machine whatever it carries (a Ray actor
call's fixed cost, measured), so the one control actor of a cluster of A session actors takes about
A / (LINGER_S + round trip) calls a second: 0.02 s cost 0.085 ms of its CPU per session at 650
sessions/s on 2 actors, 0.05 s 0.064 ms at 914 (bench ``ceiling``)."""


POLL_S = 0.25
"""How often an actor with nothing to send asks anyway, until it knows the run drains."""


class ControlLink:
    def __init__(self, control: ActorHandle):
        self._control = control
        self._begins: list[tuple[tuple[str, int], asyncio.Future[str]]] = []
        self._finished: list[tuple[Finished, asyncio.Future[None]]] = []
        self._released: list[tuple[str, int]] = []
        self.draining = False
        """Whether the control actor said the run drains (learned from every reply; for good)."""
        self.waiting = 0
        """Samples told to run that have not started yet (``started``) or given up (``release``)."""
        self._broken = False
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    async def begin(self, sample_key: str, attempt: int) -> str:
        """``run``, ``finished`` or ``draining``: see ``RunControl.exchange``."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._begins.append(((sample_key, attempt), future))
        self._kick()
        return await future

    def started(self) -> None:
        """A sample told to run has its slot and starts now."""
        self.waiting -= 1

    def finish(
        self, sample_key: str, attempt: int, record_json: str, summary_json: str
    ) -> asyncio.Future[None]:
        """Hand a record over; the future is done once the control actor has it (or fails if it can't)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finished.append(((sample_key, attempt, record_json, summary_json), future))
        self._kick()
        return future

    def release(self, sample_key: str, attempt: int) -> None:
        """A sample that was told ``run`` will not start after all (the run drains, or it was cancelled
        while it waited for a slot)."""
        self.waiting -= 1
        self._released.append((sample_key, attempt))
        self._kick()

    def _kick(self) -> None:
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_forever())

    async def _send_forever(self) -> None:
        while True:
            # Samples told to run wait for slots while long sessions run (minutes): with nothing to send,
            # ask anyway, so that a drain reaches them.
            poll = self.waiting > 0 and not self.draining and not self._broken
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S if poll else None)
            except TimeoutError:
                pass
            else:
                await asyncio.sleep(LINGER_S)
            self._wake.clear()
            begins, self._begins = self._begins, []
            finished, self._finished = self._finished, []
            released, self._released = self._released, []
            try:
                answers, draining = await self._control.exchange.remote(
                    [f for f, _ in finished], released, [k for k, _ in begins]
                )
            except BaseException as exc:  # the control actor is gone: every waiting session learns it
                self._broken = True
                futures: list[asyncio.Future[Any]] = [f for _, f in begins] + [f for _, f in finished]
                for future in futures:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                if not isinstance(exc, Exception):
                    raise  # cancelled (the actor stops): nothing waits on these futures any more
                continue
            self._broken = False
            self.draining = self.draining or draining
            for (key, future), answer in zip(begins, answers, strict=True):
                if not future.done():
                    future.set_result(answer)
                    self.waiting += answer == "run"
                elif answer == "run":  # asked, then cancelled: give it back
                    self._released.append(key)
                    self._wake.set()
            for _, future in finished:
                if not future.done():
                    future.set_result(None)
