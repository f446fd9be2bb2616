"""The simulator's ``stream: true`` answer: the reply as server-sent events, chunked like OpenAI's.

A role chunk, the reasoning and the text in pieces, each tool call as a head (id, name) and its arguments
in pieces, a final chunk with ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asks
for it, then ``data: [DONE]``. ``chunk_delay_s`` spaces the events (to test idle timeouts per chunk).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

_PIECE_CHARS = 24
"""Characters per text delta: small, so a reply arrives in many chunks as from a real provider."""


def _pieces(text: str) -> Iterator[str]:
    for start in range(0, len(text), _PIECE_CHARS):
        yield text[start : start + _PIECE_CHARS]


def chunk_deltas(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The ``delta`` objects that rebuild ``message`` when concatenated."""
    yield {"role": "assistant"}
    for piece in _pieces(message.get("reasoning_content") or ""):
        yield {"reasoning_content": piece}
    for piece in _pieces(message.get("content") or ""):
        yield {"content": piece}
    for index, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": fn["name"]}}
        yield {"tool_calls": [{**head, "function": {"name": fn["name"], "arguments": ""}}]}
        for piece in _pieces(fn.get("arguments") or ""):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


async def stream_reply(
    request: web.Request,
    payload: dict[str, Any],
    include_usage: bool,
    headers: dict[str, str],
    chunk_delay_s: float = 0.0,
) -> web.StreamResponse:
    """Send ``payload`` (a complete non-streamed response body) as a stream of chunks."""
    response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
    await response.prepare(request)
    choice = payload["choices"][0]
    base = {
        "id": payload["id"],
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": payload["model"],
        "system_fingerprint": payload.get("system_fingerprint"),
        **({"provider": payload["provider"]} if "provider" in payload else {}),
    }
    # Token ids and logprobs (when asked): the prompt's ids with the first chunk, as vLLM sends them, the
    # reply's with the finishing one (a client joins the pieces of every chunk, so one piece is a case).
    first = {"prompt_token_ids": payload["prompt_token_ids"]} if "prompt_token_ids" in payload else {}
    finishing = {k: choice[k] for k in ("logprobs", "token_ids") if choice.get(k) is not None}

    async def send(body: dict[str, Any]) -> None:
        if chunk_delay_s > 0:
            await asyncio.sleep(chunk_delay_s)
        await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")

    for delta in chunk_deltas(choice["message"]):
        await send({**base, **first, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        first = {}
    end = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], **finishing}
    await send({**base, "choices": [end]})
    if include_usage:
        await send({**base, "choices": [], "usage": payload["usage"]})
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
