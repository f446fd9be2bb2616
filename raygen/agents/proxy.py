"""raygen's model proxy for agent harnesses: one aiohttp server per session actor process, on a unix socket.

It speaks OpenAI Chat Completions (``POST /v1/chat/completions``), the OpenAI Responses API (``POST
/v1/responses``) and Anthropic Messages (``POST /v1/messages``), each streaming and not, and sends every call
through the session's own ``ChatModel``: the cluster governor, retries of 429/5xx inside the call, token
accounting and the hostile-provider protections all apply, and the harness sees a success or a final
error (HTTP 400), never a retryable one.

Each session holds a seat: a random token that only this proxy accepts, and only while the session runs
(the real API key never leaves the actor). A seat records every call (``RecordedCall``), refuses the call
past ``max_calls`` (the session's ``max_turns``) and, on a refused or failed call, sets ``stop`` so the
session can end the harness. A call with the token of a seat that closed is counted as late.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from raygen.agents import anthropic, responses, wire
from raygen.agents.base import RecordedCall
from raygen.errors import SessionFailure
from raygen.model.base import ChatModel, Completion

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest request body taken (a long conversation with its tool schemas)."""
_PREFIX = "raygen-agent-proxy-"
"""The proxy's folder in the temp dir: ``raygen-agent-proxy-<pid>-XXXX``."""
_ENDED_KEPT = 4096
"""Tokens of closed seats remembered, so a late call is told apart from a stranger's."""


@dataclass(eq=False)
class ProxySeat:
    """One session's standing with the proxy."""

    token: str
    model: ChatModel
    max_calls: int
    context: contextvars.Context
    """The session's context (its sample index: ``raygen.model.base.SAMPLE_INDEX``), for each call."""
    calls: list[RecordedCall] = field(default_factory=list)
    in_flight: int = 0
    open: bool = True
    refused: str | None = None
    failure: SessionFailure | None = None
    late_calls: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    opened: float = field(default_factory=time.monotonic)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str):
        super().__init__(status, message, kind)
        self.status, self.message, self.kind = status, message, kind


class ModelProxy:
    """The proxy of one process (``start`` on the loop that serves it, ``close`` at the end)."""

    def __init__(self, directory: str | Path | None = None):
        self._own_directory = directory is None
        if directory is None:
            remove_orphans()
            directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        self.directory = Path(directory)
        self.socket_path = self.directory / "proxy.sock"
        self._seats: dict[str, ProxySeat] = {}
        self._ended: OrderedDict[str, ProxySeat] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        self.loop = asyncio.get_running_loop()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    # --- seats --------------------------------------------------------------------------------------

    def open_seat(self, model: ChatModel, max_calls: int) -> ProxySeat:
        seat = ProxySeat(secrets.token_urlsafe(24), model, max_calls, contextvars.copy_context())
        self._seats[seat.token] = seat
        return seat

    def close_seat(self, seat: ProxySeat) -> None:
        """The seat's token stops working; calls still in flight now count as late."""
        if not seat.open:
            return
        seat.open = False
        seat.late_calls += seat.in_flight
        self._seats.pop(seat.token, None)
        self._ended[seat.token] = seat
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _seat_for(self, request: web.Request) -> ProxySeat:
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        token = token or request.headers.get("x-api-key", "").strip()
        seat = self._seats.get(token)
        if seat is not None:
            return seat
        ended = self._ended.get(token)
        if ended is not None:
            ended.late_calls += 1
            raise _Refused(
                401, "raygen: this session has ended; its token is no longer valid", "authentication_error"
            )
        raise _Refused(401, "raygen: unknown token (each session has its own)", "authentication_error")

    # --- the calls ----------------------------------------------------------------------------------

    async def _complete(self, seat: ProxySeat, call: RecordedCall) -> Completion:
        """Forward one call through the session's model, recording it; ``_Refused`` when it cannot be."""
        if len(seat.calls) >= seat.max_calls:
            seat.refused = "max_turns"
            seat.stop.set()
            raise _Refused(
                400,
                f"raygen: this session's {seat.max_calls} model calls (session.max_turns) are used up",
                "max_turns_reached",
            )
        seat.calls.append(call)
        seat.in_flight += 1
        started = time.monotonic()
        try:
            # In the session's context (its sample index picks the request seed), in a task of its own.
            task = asyncio.create_task(
                seat.model.complete(call.messages, call.tools), context=seat.context.copy()
            )
            completion = await task
        except SessionFailure as exc:
            call.error = str(exc)
            seat.failure = seat.failure or exc
            seat.stop.set()
            raise _Refused(400, f"raygen: the model call failed for good: {exc}", exc.kind) from None
        except Exception as exc:  # a bug must end this session, not the proxy
            log.exception("proxy call failed")
            call.error = f"{type(exc).__name__}: {exc}"
            seat.failure = seat.failure or SessionFailure("internal", f"model proxy: {call.error}")
            seat.stop.set()
            raise _Refused(500, "raygen: internal error in the model proxy", "internal") from None
        finally:
            seat.in_flight -= 1
            call.duration_s = round(time.monotonic() - started, 4)
        call.response = wire.assistant_message(completion)
        call.finish_reason = completion.finish_reason
        call.prompt_tokens, call.completion_tokens = completion.prompt_tokens, completion.completion_tokens
        call.provider = completion.extra.get("provider")
        return completion

    async def _read(self, request: web.Request) -> tuple[ProxySeat, dict[str, Any]]:
        seat = self._seat_for(request)
        try:
            body = await request.json(loads=json.loads)
        except ValueError:
            raise _Refused(400, "raygen: the request body is not JSON", "invalid_request_error") from None
        if not isinstance(body, dict):
            raise _Refused(400, "raygen: the request body is not a JSON object", "invalid_request_error")
        return seat, body

    def _call(self, seat: ProxySeat, api: str, body: dict[str, Any], parts: Any) -> RecordedCall:
        try:
            messages, tools = parts(body)
        except ValueError as exc:
            raise _Refused(400, f"raygen: {exc}", "invalid_request_error") from None
        started = round(time.monotonic() - seat.opened, 4)
        return RecordedCall(api, bool(body.get("stream")), messages, tools, started)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            seat, body = await self._read(request)
            call = self._call(seat, "chat", body, wire.request_parts)
            completion = await self._complete(seat, call)
        except _Refused as refused:
            return web.json_response(wire.chat_error(refused.message, refused.kind), status=refused.status)
        name = seat.model.name
        if not call.stream:
            return web.json_response(wire.chat_completion(completion, name))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response = await _event_stream(request)
        for chunk in wire.chat_chunks(completion, name, include_usage):
            await response.write(wire.sse(chunk))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            seat, body = await self._read(request)
            call = self._call(seat, "messages", body, anthropic.request_parts)
            completion = await self._complete(seat, call)
        except _Refused as refused:
            kind = "invalid_request_error" if refused.status == 400 else refused.kind
            return web.json_response(anthropic.error_body(refused.message, kind), status=refused.status)
        name = seat.model.name
        if not call.stream:
            return web.json_response(anthropic.message_body(completion, name))
        response = await _event_stream(request)
        for event, data in anthropic.message_events(completion, name):
            await response.write(wire.sse(data, event))
        await response.write_eof()
        return response

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        try:
            seat, body = await self._read(request)
            call = self._call(seat, "responses", body, responses.request_parts)
            completion = await self._complete(seat, call)
        except _Refused as refused:
            return web.json_response(
                responses.error_body(refused.message, refused.kind), status=refused.status
            )
        name = seat.model.name
        if not call.stream:
            return web.json_response(responses.response_body(completion, name))
        response = await _event_stream(request)
        for event, data in responses.response_events(completion, name):
            await response.write(wire.sse(data, event))
        await response.write_eof()
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            _, body = await self._read(request)
        except _Refused as refused:
            return web.json_response(
                anthropic.error_body(refused.message, refused.kind), status=refused.status
            )
        return web.json_response(anthropic.count_tokens(body))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            seat = self._seat_for(request)
        except _Refused as refused:
            return web.json_response(wire.chat_error(refused.message, refused.kind), status=refused.status)
        model = {"id": seat.model.name, "object": "model", "created": 0, "owned_by": "raygen"}
        return web.json_response({"object": "list", "data": [model]})


def remove_orphans() -> int:
    """Remove the folders of proxies whose process is gone (an actor killed before its ``close``)."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = folder.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response
