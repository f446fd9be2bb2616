"""Time a session spends held by the rate gate does not count against its ``session_timeout_s``.

A session waiting for the cluster's governor (paced behind a rate limit, or paused after the provider
refused) is not stuck: killing it with ``session_timeout`` threw away healthy sessions for a wait the run
imposed on them (issue 24). So the session's deadline is an ``asyncio.Timeout`` that stands still while
the session is held: ``session_deadline`` sets it up for the session's task, and a gate wraps its wait in
``held()``. Everything else (model calls, retries' own backoff within ``model.retry_max_wait_s``, tools,
the environment, grading) runs on the session's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar


class SessionClock:
    """A session's deadline that stops while the session is held by the rate gate."""

    def __init__(self, timeout: asyncio.Timeout):
        self._timeout = timeout
        self._depth = 0
        self._remaining: float | None = None
        self._since = 0.0
        self.held_s = 0.0
        """Seconds the session has been held so far (the deadline moved by as much)."""

    def hold(self) -> None:
        self._depth += 1
        if self._depth > 1 or self._timeout.expired():
            return
        now = asyncio.get_running_loop().time()
        when = self._timeout.when()
        self._remaining = None if when is None else when - now
        self._since = now
        self._timeout.reschedule(None)

    def resume(self) -> None:
        self._depth -= 1
        if self._depth > 0 or self._timeout.expired():
            return
        now = asyncio.get_running_loop().time()
        self.held_s += now - self._since
        if self._remaining is not None:
            self._timeout.reschedule(now + self._remaining)


_CLOCK: ContextVar[SessionClock | None] = ContextVar("raygen_session_clock", default=None)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The current session (if any) is held by the rate gate for the duration of the block."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    clock.hold()
    try:
        yield
    finally:
        clock.resume()


@contextlib.asynccontextmanager
async def session_deadline(seconds: float) -> AsyncIterator[SessionClock]:
    """Like ``asyncio.timeout(seconds)`` (``TimeoutError`` when it passes), except that time held by the
    rate gate inside the block is not counted."""
    async with asyncio.timeout(seconds) as timeout:
        clock = SessionClock(timeout)
        token = _CLOCK.set(clock)
        try:
            yield clock
        finally:
            _CLOCK.reset(token)
