"""Graceful preemption: SIGTERM, SIGINT and SIGUSR1 start a drain, a second one stops at once.

A drain lets the sessions in flight finish (for up to ``retry.drain_timeout_s``) while no new session
starts, makes everything finished durable, merges, and ends the run with ``EXIT_RESUMABLE``: the batch
system (or the user) runs the same command with ``--resume`` to finish it. The handler only sets a flag
(or raises ``StopNow`` on the second signal); the driver's result loop does the rest.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

EXIT_RESUMABLE = 75
"""Exit code of a run stopped before every sample ran, which ``--resume`` continues (EX_TEMPFAIL)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopNow(KeyboardInterrupt):
    """A second signal during a drain: stop at once (what is already durable stays so)."""


@contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started inside (the simulator, a local Ray's processes) inherit SIGINT ignored: Ctrl-C
    in a terminal signals the whole foreground process group, and must drain the driver, not kill the
    services under the sessions in flight. (Python and well-behaved programs keep an inherited ignored
    SIGINT.) Meanwhile the driver ignores it too; ``Drain.install`` comes right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Drain:
    """Installs the handlers for the duration of a ``with`` block (only in the main thread, the only
    one Python lets set them) and restores the previous ones afterwards."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.signal_name: str | None = None
        self._requested_at: float | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self._requested_at is not None

    @property
    def expired(self) -> bool:
        """The sessions in flight had their ``timeout_s`` to finish."""
        return self._requested_at is not None and time.monotonic() - self._requested_at >= self.timeout_s

    def request(self, signal_name: str = "request") -> None:
        if self._requested_at is None:
            self._requested_at = time.monotonic()
            self.signal_name = signal_name

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            raise StopNow(f"second signal ({signal.Signals(signum).name}): stopping at once")
        self.request(signal.Signals(signum).name)

    def install(self) -> None:
        """(Re)install the handlers: ``ray.init`` sets its own SIGTERM handler (exit at once), so the
        driver calls this again once Ray is up."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)

    def __enter__(self) -> Drain:
        self.install()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
