"""The simulator started beside its caller: on its own thread and loop (``start_in_thread``) or as
``python -m raygen.sim`` in a child process (``start_subprocess``, so it does not share the caller's GIL).
The server itself: ``raygen.sim.server``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from raygen.model.configs import SimConfig
from raygen.sim.server import URL_LINE_PREFIX, SimServer


class SimHandle:
    """A simulator running on its own thread and event loop."""

    def __init__(
        self, url: str, loop: asyncio.AbstractEventLoop, stop: asyncio.Event, thread: threading.Thread
    ):
        self.url = url
        self._loop, self._stop, self._thread = loop, stop, thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server, flush its log and join the thread (idempotent)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(cfg: SimConfig, startup_timeout_s: float = 30.0) -> SimHandle:
    """Start the simulator on a new daemon thread with its own loop; returns once it accepts requests."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        try:
            async with SimServer(cfg) as server:
                box.update(url=server.url, loop=asyncio.get_running_loop(), stop=stop)
                started.set()
                await stop.wait()
        except Exception as exc:  # reported to the caller below, not as a thread traceback
            box["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="raygen-sim", daemon=True)
    thread.start()
    if not started.wait(startup_timeout_s) or "url" not in box:
        raise RuntimeError(f"simulator did not start: {box.get('error')!r}")
    return SimHandle(box["url"], box["loop"], box["stop"], thread)


class SimProcess:
    """A simulator running as ``python -m raygen.sim`` in a child process."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (the child flushes its log), wait, and SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_subprocess(cfg: SimConfig, startup_timeout_s: float = 30.0) -> SimProcess:
    """Start the simulator in a child process and return once it printed its URL."""
    env = dict(os.environ)
    # The child must import this very raygen, installed or not (e.g. run from a source checkout).
    source_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "raygen.sim", "--config-json", cfg.model_dump_json()]
    cmd += ["--parent-pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = _read_line(proc, startup_timeout_s)
        if not line.startswith(URL_LINE_PREFIX):
            raise RuntimeError(f"simulator did not start (exit code {proc.poll()}, first line {line!r})")
    except BaseException:
        SimProcess(proc, "").stop()
        raise
    return SimProcess(proc, line[len(URL_LINE_PREFIX) :].strip())


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """First stdout line of ``proc`` within ``timeout_s`` (a reader thread: pipe reads cannot time out)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box:
        raise RuntimeError(f"simulator printed no URL within {timeout_s}s")
    return box[0]
