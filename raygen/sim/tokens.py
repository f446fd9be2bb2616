"""The simulator's token ids and logprobs, so every path of token capture runs without a real server.

A request asking for them (``return_token_ids``, vLLM's extension; ``logprobs`` / ``top_logprobs``,
OpenAI's) gets ``prompt_token_ids`` on the response, ``token_ids`` and ``logprobs.content`` on the
choice, as vLLM sends them. With ``sim.tokenizer`` (a local Hugging Face tokenizer folder) the ids are the
ones vLLM serving that model would give: the request rendered with its chat template, the reply as the
template renders it up to the end-of-turn token. Without one, a stand-in: each message a segment
``<start> role-text body-text <end>`` of 4-byte chunk ids (ids no real tokenizer gives, but prefix-consistent
from turn to turn as a template is). Logprobs are drawn from a seed of the request, so they are
reproducible; the usage then counts the ids.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any

from raygen.formats.chat_template import load_tokenizer, render_ids, reply_ids

START_ID, END_ID = 1, 2
"""The stand-in's segment markers (its texts are ``<|im_start|>`` and ``<|im_end|>``)."""
_CHUNK_IDS = 50_000


@dataclass
class SimTokens:
    prompt_ids: list[int]
    reply_ids: list[int]
    texts: list[str]
    """Each reply token's text (what ``logprobs.content[].token`` says)."""


def _chunk_ids(text: str) -> list[int]:
    data = text.encode("utf-8")
    return [3 + int.from_bytes(data[i : i + 4], "little") % _CHUNK_IDS for i in range(0, len(data), 4)]


def _chunk_texts(text: str) -> list[str]:
    data = text.encode("utf-8")
    return [data[i : i + 4].decode("utf-8", errors="replace") for i in range(0, len(data), 4)]


def _body(message: dict[str, Any]) -> str:
    parts = [str(message.get(k) or "") for k in ("reasoning_content", "content")]
    parts += [json.dumps(call.get("function"), sort_keys=True) for call in message.get("tool_calls") or ()]
    return "\n".join(p for p in parts if p)


def _segment(role: str, body: str) -> list[int]:
    return [START_ID, *_chunk_ids(role + "\n"), *_chunk_ids(body), END_ID]


def stand_in_tokens(messages: list[dict[str, Any]], tools: list[Any], reply: dict[str, Any]) -> SimTokens:
    prompt: list[int] = _segment("tools", json.dumps(tools, sort_keys=True)) if tools else []
    for message in messages:
        prompt += _segment(str(message.get("role")), _body(message))
    prompt += [START_ID, *_chunk_ids("assistant\n")]
    body = _body(reply)
    return SimTokens(prompt, [*_chunk_ids(body), END_ID], [*_chunk_texts(body), "<|im_end|>"])


def tokenizer_tokens(
    name: str, messages: list[dict[str, Any]], tools: list[Any], reply: dict[str, Any]
) -> SimTokens:
    tokenizer = load_tokenizer(name)
    prompt = render_ids(tokenizer, messages, tools, generation_prompt=True)
    ids = reply_ids(tokenizer, messages, reply, tools)
    return SimTokens(prompt, ids, [tokenizer.decode([i]) for i in ids])


def add_token_fields(payload: dict[str, Any], body: dict[str, Any], tokenizer: str | None) -> None:
    """Add to ``payload`` (a complete response body) the ids and logprobs ``body`` asks for, as vLLM
    does, and count the ids in its usage."""
    if not (body.get("return_token_ids") or body.get("logprobs") or body.get("top_logprobs")):
        return
    choice = payload["choices"][0]
    response_fields, choice_fields, tokens = token_fields(body, choice["message"], tokenizer)
    payload.update(response_fields)
    choice.update(choice_fields)
    prompt, reply = len(tokens.prompt_ids), len(tokens.reply_ids)
    payload["usage"] = {"prompt_tokens": prompt, "completion_tokens": reply, "total_tokens": prompt + reply}


def token_fields(
    body: dict[str, Any], reply: dict[str, Any], tokenizer: str | None
) -> tuple[dict, dict, SimTokens]:
    """``(response fields, choice fields, tokens)`` for a request that asked for ids or logprobs."""
    messages, tools = body.get("messages") or [], body.get("tools") or []
    tokens = (tokenizer_tokens if tokenizer else lambda _n, *a: stand_in_tokens(*a))(
        tokenizer, messages, tools, reply
    )
    response: dict[str, Any] = {}
    choice: dict[str, Any] = {}
    if body.get("return_token_ids"):
        response["prompt_token_ids"] = tokens.prompt_ids
        choice["token_ids"] = tokens.reply_ids
    if body.get("logprobs") or body.get("top_logprobs"):
        choice["logprobs"] = {"content": _logprobs(tokens, int(body.get("top_logprobs") or 0))}
    return response, choice, tokens


def _logprobs(tokens: SimTokens, top: int) -> list[dict[str, Any]]:
    seed = hashlib.sha256(json.dumps([tokens.prompt_ids[-64:], tokens.reply_ids]).encode()).digest()
    rng = random.Random(seed)
    content = []
    for text in tokens.texts:
        logprob = -round(rng.expovariate(4.0), 6)
        entry: dict[str, Any] = {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
        alternatives = [{"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}]
        for i in range(1, top):
            alt = logprob - round(rng.uniform(0.1, 3.0) * i, 6)
            alternatives.append({"token": f"<alt{i}>", "logprob": alt, "bytes": list(f"<alt{i}>".encode())})
        entry["top_logprobs"] = alternatives if top else []
        content.append(entry)
    return content
