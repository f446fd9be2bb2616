"""A minimal Chrome DevTools Protocol client over aiohttp, to drive Debian's headless chromium in tests.

Chromium is started with ``--remote-debugging-port=0`` and writes the port it picked to
``DevToolsActivePort`` in its user-data dir; we attach to its first page target over a websocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


class Browser:
    """``async with Browser(profile_dir) as b``: ``b.call(method, **params)``, ``b.events``."""

    def __init__(self, profile_dir: Path, binary: str | None = None, start_timeout_s: float = 30.0):
        self.profile_dir = profile_dir
        self.binary = binary or find_chromium()
        self.start_timeout_s = start_timeout_s
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._proc: subprocess.Popen | None = None

    async def __aenter__(self) -> Browser:
        if self.binary is None:
            raise RuntimeError("chromium not found")
        self._proc = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: we stop chromium and its helpers together
        )
        self._http = aiohttp.ClientSession()
        self._reader: asyncio.Task | None = None
        self._ws = None
        try:
            port = await self._port()
            async with self._http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            page = next(t for t in targets if t.get("type") == "page")
            self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        except BaseException:
            await self.__aexit__()
            raise
        self._reader = asyncio.create_task(self._read())
        return self

    async def _port(self) -> int:
        marker = self.profile_dir / "DevToolsActivePort"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        while loop.time() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(marker.read_text().splitlines()[0])
            await asyncio.sleep(0.1)
        raise TimeoutError("chromium did not report its DevTools port")

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def call(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one command; returns its ``result`` (raises on a protocol error)."""
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, timeout_s)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        """Evaluate JS in the page and return its value (exceptions raise)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS exception: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for_event(self, method: str, timeout_s: float = 30.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            for event in self.events:
                if event["method"] == method:
                    return event
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {method} within {timeout_s} s")

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        await self._http.close()
        if self._proc is not None:
            self._signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._proc.wait()

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)  # the group chromium leads (start_new_session)
