"""How a record stores the prompt token ids of its turns, and how they are read back.

Turn n's prompt is turn n-1's prompt, its reply, and what came after (tool results, the next generation
prompt). Stored whole, a session's ids would grow with the square of its length, so a turn keeps only the
ids past the previous turn's prompt and reply when its prompt starts with them
(``TurnInfo.prompt_token_ids_from`` says where the kept ids start), and the whole prompt otherwise (a chat
template that re-renders history, e.g. one that drops earlier reasoning, breaks the prefix).
"""

from __future__ import annotations

from typing import Any


def stored_prompt_ids(prompt_ids: list[int], context: list[int] | None) -> tuple[list[int], int]:
    """``(ids to store, where they start)`` for a prompt whose previous turn's prompt + reply ids were
    ``context`` (None on the first turn or when the previous turn had no ids)."""
    if context and len(prompt_ids) >= len(context) and prompt_ids[: len(context)] == context:
        return prompt_ids[len(context) :], len(context)
    return list(prompt_ids), 0


def _field(turn: Any, name: str) -> Any:
    return turn.get(name) if isinstance(turn, dict) else getattr(turn, name, None)


def full_prompts(turns: list[Any]) -> list[list[int] | None]:
    """Each turn's whole prompt ids (None where the turn has none or its stored ids cannot be placed)."""
    prompts: list[list[int] | None] = []
    context: list[int] | None = None
    for turn in turns:
        ids, start = _field(turn, "prompt_token_ids"), int(_field(turn, "prompt_token_ids_from") or 0)
        if ids is None or (start and (context is None or len(context) != start)):
            prompts.append(None)
            context = None
            continue
        prompt = (context or [])[:start] + list(ids)
        prompts.append(prompt)
        reply = _field(turn, "token_ids")
        context = prompt + list(reply) if reply is not None else None
    return prompts
