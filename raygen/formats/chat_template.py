"""Render a conversation with a model's chat template: the token ids a model served by vLLM sees.

Used by the simulator (``sim.tokenizer``: prompts and replies tokenized as vLLM serving that model would)
and by the ``tokens`` export and its template check. The tokenizer is a Hugging Face one (a local folder
or a hub name already in the local cache), loaded with ``transformers``: the optional ``export`` extra,
imported only here and only when a tokenizer is asked for.

Messages are handed to the template as vLLM hands them: tool-call arguments parsed from their JSON string
into an object (templates write them with ``tojson``), a ``reasoning`` field under the name templates read
(``reasoning_content``), no content as "".
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from raygen.errors import ConfigError

INSTALL_HINT = 'pip install "raygen[export]"'


@functools.lru_cache(maxsize=4)
def load_tokenizer(name_or_path: str) -> Any:
    """A Hugging Face tokenizer with a chat template; ConfigError naming the fix when it cannot load.
    A local folder, or a hub name already in the local cache: nothing is downloaded (an export must not
    depend on the network, and the tokenizer it renders with is one the user chose)."""
    if name_or_path.startswith(("/", "./", "../", "~")) and not os.path.isdir(
        os.path.expanduser(name_or_path)
    ):
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: no such folder")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(f"--tokenizer needs transformers: {INSTALL_HINT} ({exc})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(name_or_path), local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot load tokenizer {name_or_path!r}: {first}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"tokenizer {name_or_path!r} has no chat template")
    return tokenizer


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI-format message as chat templates expect it (see the module docstring)."""
    out = {k: v for k, v in message.items() if v is not None and k != "reasoning"}
    if out.get("content") is None:
        out["content"] = ""
    if isinstance(message.get("reasoning"), str) and "reasoning_content" not in out:
        out["reasoning_content"] = message["reasoning"]
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                **call,
                "function": {
                    **call.get("function", {}),
                    "arguments": _arguments(call.get("function", {}).get("arguments")),
                },
            }
            for call in message["tool_calls"]
        ]
    return out


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    generation_prompt: bool,
) -> list[int]:
    """The token ids of ``messages`` (OpenAI format) rendered with the tokenizer's chat template."""
    return list(_render(tokenizer, messages, tools, generation_prompt, tokenize=True))


def render_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    generation_prompt: bool,
) -> str:
    """The text of ``messages`` rendered with the tokenizer's chat template."""
    return str(_render(tokenizer, messages, tools, generation_prompt, tokenize=False))


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool, tokenize: bool
) -> Any:
    rendered = tokenizer.apply_chat_template(
        [template_message(m) for m in messages],
        tools=tools or None,
        add_generation_prompt=generation_prompt,
        tokenize=tokenize,
        return_dict=False,
    )
    if tokenize and isinstance(rendered, dict):  # some versions return a BatchEncoding regardless
        rendered = rendered["input_ids"]
    return rendered


def reply_ids(tokenizer: Any, messages: list[dict[str, Any]], reply: dict[str, Any], tools: Any) -> list[int]:
    """The ids a model emits for ``reply`` after ``messages``: what the template renders for the reply
    after the generation prompt, up to and including the end-of-turn token (the rest, e.g. a newline,
    is the template's glue that the next prompt adds)."""
    prompt = render_text(tokenizer, messages, tools, generation_prompt=True)
    full = render_text(tokenizer, [*messages, reply], tools, generation_prompt=False)
    text = full[len(prompt) :] if full.startswith(prompt) else str(reply.get("content") or "")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    eos = tokenizer.eos_token_id
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return ids
