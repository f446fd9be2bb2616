"""FakeModal: the fake control plane and command router on one loopback port, in a thread of its own.

The server runs on its own event loop in a daemon thread, so it outlives each test's event loop and the
``modal`` SDK's process-wide client (``Client.from_env`` is a singleton bound to one server URL) can be
shared by every test. Point the SDK at it with ``MODAL_SERVER_URL=fake.url``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from grpclib.server import Server

from fake_modal.sandboxes import FakeSandbox
from fake_modal.services import FakeCommandRouter, FakeControlPlane, FakeState

T = TypeVar("T")


class FakeModal:
    """Start with ``start()``, stop with ``stop()`` (terminates every sandbox still running)."""

    def __init__(self, base_dir: Path):
        self.state = FakeState(base_dir=Path(base_dir))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-modal", daemon=True)
        self._server: Server | None = None

    @property
    def url(self) -> str:
        return self.state.url

    def start(self) -> FakeModal:
        self._thread.start()
        self._call(self._start())
        return self

    async def _start(self) -> None:
        self._server = Server([FakeControlPlane(self.state), FakeCommandRouter(self.state)])
        await self._server.start("127.0.0.1", 0)
        port = self._server._server.sockets[0].getsockname()[1]
        self.state.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._call(self._stop(), timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _stop(self) -> None:
        for sandbox in list(self.state.sandboxes.values()):
            await sandbox.terminate()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _call(self, coro, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def inspect(self, read: Callable[[FakeState], T]) -> T:
        """Run ``read(state)`` on the fake's thread (its state is not thread-safe); return the result."""

        async def run() -> T:
            return read(self.state)

        return self._call(run())

    async def inspect_async(self, read: Callable[[FakeState], T]) -> T:
        """``inspect`` from a coroutine, without blocking the caller's event loop."""
        return await asyncio.to_thread(self.inspect, read)

    def terminate(self, sandbox_id: str) -> None:
        """End a sandbox from the outside, as Modal's dashboard or an outage would."""

        async def run() -> None:
            await self.state.sandboxes[sandbox_id].terminate()

        self._call(run())

    def sandboxes_tagged(self, name: str, value: str) -> list[FakeSandbox]:
        """The sandboxes (running or not) whose tag ``name`` is ``value``."""
        return self.inspect(
            lambda state: [sb for sb in state.sandboxes.values() if sb.tags.get(name) == value]
        )
