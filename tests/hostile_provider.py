"""A hostile OpenAI-compatible provider for tests: like the simulator, but every answer is scripted.

``HostileProvider(script)`` serves ``POST /v1/chat/completions`` on 127.0.0.1; the n-th request gets
``script[n]`` (the last step repeats). A step is an async function ``(request, body) -> response`` that
misbehaves in exactly one way: ``answer``/``tool_call`` are well-formed, the others are the hostile cases
of issue 15 (an absurd Retry-After, a trickling body, malformed or non-UTF-8 JSON, a huge reply).
``requests`` counts what the provider received, so tests can hold raygen's own counting against it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Step = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 0,
        "model": "hostile",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def answer(text: str = "done") -> Step:
    """A well-formed final answer."""

    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(_completion({"role": "assistant", "content": text}))

    return step


def tool_call(name: str, arguments: dict[str, Any] | str) -> Step:
    """A well-formed reply calling one tool (``arguments`` as an object, or raw text sent as given)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)

    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": raw}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return web.json_response(_completion(message, "tool_calls"))

    return step


def status(code: int, headers: dict[str, str] | None = None) -> Step:
    """An error status with an OpenAI-style error body (and e.g. ``Retry-After``)."""

    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        error = {"error": {"message": f"hostile {code}", "type": "server_error"}}
        return web.json_response(error, status=code, headers=headers or {})

    return step


def trickle(interval_s: float = 2.0, total_bytes: int = 1000) -> Step:
    """200 headers at once, then the body one byte every ``interval_s``: no single read ever times out."""

    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for _ in range(total_bytes):
                await response.write(b" ")
                await asyncio.sleep(interval_s)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client hung up, as it should
        return response

    return step


def raw_body(data: bytes) -> Step:
    """200 with ``Content-Type: application/json`` and exactly these bytes (malformed, non-UTF-8, ...)."""

    async def step(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.Response(body=data, headers={"Content-Type": "application/json"})

    return step


def huge_reply(chars: int) -> Step:
    """A final answer of ``chars`` characters (each JSON-escaped to two, as a hostile model might)."""
    return answer('"' * chars)


class HostileProvider:
    """``async with HostileProvider([step, ...]) as p:`` then point a client at ``p.url``.

    ``script`` may also map a prompt (the first user message) to its own steps, for runs whose sessions
    reach the provider in any order; ``per_prompt`` then counts each prompt's requests."""

    def __init__(self, script: list[Step] | dict[str, list[Step]]):
        scripts = script.values() if isinstance(script, dict) else [script]
        if not all(scripts):
            raise ValueError("a script needs at least one step")
        self.script = script
        self.per_prompt: dict[str, int] = {}
        self.requests = 0
        self.bodies: list[bytes] = []
        """Every request body received, as sent (to check what reached the provider)."""
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.bodies.append(raw)
        body = json.loads(raw)
        steps, index = self.script, self.requests
        if isinstance(self.script, dict):
            prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
            steps, index = self.script[prompt], self.per_prompt.get(prompt, 0)
            self.per_prompt[prompt] = index + 1
        self.requests += 1
        return await steps[min(index, len(steps) - 1)](request, body)

    async def __aenter__(self) -> HostileProvider:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
