"""The simulator's HTTP face: an OpenAI-compatible chat-completions server on aiohttp.

Routes: ``POST /v1/chat/completions`` (``stream: true`` answers server-sent events), ``GET /v1/models``,
``GET /sim/stats`` and ``POST /sim/reset``. Realism knobs come from ``SimConfig``: latency with jitter,
hard request and token rate limits counted as a token bucket or fixed or sliding windows (429 with
``Retry-After``; ``raygen.sim.limits``), a share of 5xx answers, and per-session hallucination and
reasoning choices (in ``raygen.model.sim_policy``). Model names starting with ``nonexistent`` get 404; a reply
longer than the request's ``max_tokens`` is cut (``finish_reason: length``).

Three ways to run it: ``async with SimServer(cfg)`` on the current loop, and (``raygen.sim.launch``)
``start_in_thread`` (own thread and loop) and ``start_subprocess`` (own process, so it does not share the
caller's GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from raygen.formats.chat_template import load_tokenizer
from raygen.model.configs import SimConfig
from raygen.model.sim_policy import (
    PolicyReply,
    count_assistant_turns,
    first_user_text,
    is_nonexistent_model,
    is_slow,
    respond,
)
from raygen.sim.limits import RateLimits
from raygen.sim.streaming import stream_reply
from raygen.sim.tokens import add_token_fields

URL_LINE_PREFIX = "RAYGEN_SIM_URL="
"""First stdout line of ``python -m raygen.sim``: the bound base URL."""
SIM_MODEL_ID = "raygen-sim"
_HISTOGRAM_SECONDS = 3600  # accepted-per-second buckets kept in /sim/stats


class SimStats:
    """Counters for benchmarks; cheap enough to update on every request."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.counts = {"requests": 0, "ok": 0, "429": 0, "5xx": 0, "4xx": 0}
        self.in_flight = self.max_in_flight = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.accepted_per_second: dict[int, int] = {}

    def accepted(self) -> None:
        """A request passed the rate limit (it may still get a simulated 5xx)."""
        second = int(time.time())
        self.accepted_per_second[second] = self.accepted_per_second.get(second, 0) + 1
        if len(self.accepted_per_second) > _HISTOGRAM_SECONDS:
            del self.accepted_per_second[min(self.accepted_per_second)]

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.counts,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "accepted_per_second": {str(k): v for k, v in sorted(self.accepted_per_second.items())},
        }


class RequestLog:
    """Buffered JSONL request log. Only fields built here are written: never headers or keys."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lines: list[str] = []

    def add(self, record: dict[str, Any]) -> None:
        self._lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")))

    def flush(self) -> None:
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    async def flush_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.flush()


_LOGGED_OPTIONS = ("stream", "stream_options", "reasoning", "reasoning_effort", "provider", "max_tokens")


def _system_sha(messages: list[Any]) -> str | None:
    system = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    return hashlib.sha256(str(system[0]).encode()).hexdigest()[:16] if system else None


def _error(status: int, message: str, kind: str, code: str | None, headers: dict[str, str]) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class SimServer:
    """The simulator bound to a port of the current event loop: ``async with SimServer(cfg) as s: s.url``."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.stats = SimStats()
        self._rng = random.Random(cfg.seed)
        limited = cfg.rate_limit_rpm is not None or cfg.rate_limit_tpm is not None
        self._limits = RateLimits(cfg) if limited else None
        self._log = RequestLog(cfg.log_path) if cfg.log_path is not None else None
        self._flusher: asyncio.Task | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        """Base URL of the OpenAI API, e.g. ``http://127.0.0.1:PORT/v1``."""

    async def start(self) -> None:
        if self.cfg.tokenizer:  # fail at start, naming the fix, rather than with a 500 per request
            load_tokenizer(self.cfg.tokenizer)
        app = web.Application(client_max_size=256 * 1024 * 1024)  # long agent conversations are big
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/sim/reset", self._reset)
        # No access log: it costs CPU per request and would print request lines we do not control.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, backlog=4096, reuse_address=True)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
        if self._log is not None:
            self._flusher = asyncio.create_task(self._log.flush_every(1.0))

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._log is not None:
            self._log.flush()

    async def __aenter__(self) -> SimServer:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def reset(self) -> None:
        """Zero the counters and the rate limits' counts."""
        self.stats.reset()
        if self._limits is not None:
            self._limits.reset()

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": SIM_MODEL_ID, "object": "model", "created": 0, "owned_by": "raygen"}
        return web.json_response({"object": "list", "data": [model]})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.snapshot())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    def _record(
        self, status: int, body: dict[str, Any], decision: dict | None, calls: list[str], tokens: int = 0
    ) -> None:
        counts = self.stats.counts
        if status == 200:
            counts["ok"] += 1
        elif status == 429:
            counts["429"] += 1
        elif status >= 500:
            counts["5xx"] += 1
        else:
            counts["4xx"] += 1
        if self._log is None:
            return
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        prompt = first_user_text(messages)
        self._log.add(
            {
                "ts": round(time.time(), 3),
                "prompt_sha": hashlib.sha256(prompt.encode()).hexdigest()[:16],
                "model": str(body.get("model", "")),
                "turn": count_assistant_turns(messages),
                "status": status,
                "decision": decision,
                "tool_calls": calls,
                "tokens": tokens,
                # What the client asked for besides the conversation, and the conversation's shape, so
                # tests can see what was sent (streaming, reasoning, routing, prefill, system prompt).
                "options": {k: body[k] for k in _LOGGED_OPTIONS if k in body},
                "roles": [str(m.get("role")) for m in messages if isinstance(m, dict)],
                "system_sha": _system_sha(messages),
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.counts["requests"] += 1
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._record(400, {}, None, [])
            return _error(400, "body must be a JSON object with messages", "invalid_request_error", None, {})

        # The rate limit is checked on arrival, like a provider's gateway, before any simulated work.
        headers, reply, refused = self._admit(body)
        if refused is not None:
            return refused
        self.stats.accepted()

        model = str(body.get("model") or "")
        if is_nonexistent_model(model):
            self._record(404, body, None, [])
            msg = f"The model `{model}` does not exist"
            return _error(404, msg, "invalid_request_error", "model_not_found", headers)

        failed = await self._simulated_work(body, headers)
        if failed is not None:
            return failed

        reply = reply or respond(body, self.cfg)
        self.stats.prompt_tokens += reply.prompt_tokens
        self.stats.completion_tokens += reply.completion_tokens
        calls = [tc["function"]["name"] for tc in reply.message.get("tool_calls", ())]
        self._record(200, body, reply.decision, calls, reply.prompt_tokens + reply.completion_tokens)
        payload = self._payload(body, reply, model)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await stream_reply(request, payload, usage, headers, self.cfg.stream_chunk_delay_s)
        return web.json_response(payload, headers=headers)

    def _admit(self, body: dict[str, Any]) -> tuple[dict[str, str], PolicyReply | None, web.Response | None]:
        """(rate-limit headers, the reply if computed to charge its tokens, a 429 response if refused)."""
        headers: dict[str, str] = {}
        reply = None
        if self._limits is None:
            return headers, reply, None
        tokens = 0.0
        if self._limits.counts_tokens:  # charged on arrival: prompt + the completion it will get
            reply = respond(body, self.cfg)
            tokens = reply.prompt_tokens + reply.completion_tokens
        wait_s = self._limits.try_admit(tokens)
        headers = self._limits.headers() if self.cfg.rate_limit_headers else {}
        if wait_s <= 0:
            return headers, reply, None
        headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
        headers["retry-after-ms"] = str(math.ceil(wait_s * 1000))
        self._record(429, body, {"retry_after_s": round(wait_s, 3)}, [])
        refused = _error(429, "Rate limit reached (simulated)", "requests", "rate_limit_exceeded", headers)
        return headers, reply, refused

    async def _simulated_work(self, body: dict[str, Any], headers: dict[str, str]) -> web.Response | None:
        """The latency (with jitter, slow prompts) and the share of 5xx answers; the 5xx response, if one."""
        fail_status = None
        if self.cfg.error_rate > 0 and self._rng.random() < self.cfg.error_rate:
            fail_status = self._rng.choice((500, 503))
        delay = self.cfg.latency_s
        if self.cfg.latency_jitter_s > 0:
            delay += self._rng.uniform(-self.cfg.latency_jitter_s, self.cfg.latency_jitter_s)
        if self.cfg.slow_rate > 0 and is_slow(first_user_text(body.get("messages") or []), self.cfg):
            delay *= self.cfg.slow_factor

        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self.stats.in_flight -= 1
        if fail_status is not None:
            self._record(fail_status, body, None, [])
            return _error(fail_status, "Simulated server error", "server_error", None, headers)
        return None

    def _payload(self, body: dict[str, Any], reply: PolicyReply, model: str) -> dict[str, Any]:
        """The chat completion's JSON body for ``reply``."""
        payload = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or SIM_MODEL_ID,
            "system_fingerprint": f"raygen-sim-{self.cfg.seed}",
            "choices": [
                {"index": 0, "message": reply.message, "finish_reason": reply.finish_reason, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        if (price := self.cfg.reported_price) is not None:  # as OpenRouter reports a call's cost
            micro = reply.prompt_tokens * price.input + reply.completion_tokens * price.output
            payload["usage"]["cost"] = micro / 1e6
        add_token_fields(payload, body, self.cfg.tokenizer)  # ids and logprobs, when asked
        if self.cfg.provider_name:
            payload["provider"] = self.cfg.provider_name
        return payload


async def serve_forever(
    cfg: SimConfig, ready: Callable[[str], None] | None = None, *, parent_pid: int | None = None
) -> None:
    """Serve until cancelled, SIGTERM or SIGINT (when run in the main thread); the log is flushed on exit.

    ``ready`` receives the base URL once the port is bound. With ``parent_pid``, also stop when that
    process is no longer our parent (the driver died), so a simulator is never orphaned.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored by whoever started us (raygen's driver: Ctrl-C drains the run)
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals
            pass
    try:
        async with SimServer(cfg) as server:
            if ready is not None:
                ready(server.url)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                if parent_pid is not None and os.getppid() != parent_pid:
                    break
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
