"""Shared by the verify tests: the vendored verified tasks, and a model double that plays a given script."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raygen.config import SessionConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.session.agent import SessionRunner
from raygen.tools.registry import load_registry

DATA = Path(__file__).resolve().parents[1] / "data"
TASKS = DATA / "verified-tasks.jsonl"
SOLUTIONS = DATA / "verified-tasks.solutions.jsonl"


def task_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TASKS.read_text(encoding="utf-8").splitlines()]


def solutions() -> dict[str, str]:
    lines = SOLUTIONS.read_text(encoding="utf-8").splitlines()
    return {row["id"]: row["solution_py"] for row in map(json.loads, lines)}


def sample_of(row: dict[str, Any], **verify: Any) -> Sample:
    data = dict(row)
    if verify:
        data["verify"] = {**data["verify"], **verify}
    return Sample(
        row=PromptRow.model_validate(data),
        sample_key="k" * 24,
        prompt_index=0,
        line=1,
        toolsets=["file", "terminal"],
    )


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


class ToolScript(ChatModel):
    """Each reply makes the given tool calls, in order; then one final answer. A double of the Model
    seam for agents that behave in one exact way (cheat, peek, delete the tests)."""

    name = "tool-script"

    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]]):
        self.turns = list(turns)
        self.seen: list[list[dict[str, Any]]] = []

    async def complete(self, messages, tools, **_: Any) -> Completion:
        self.seen.append([dict(m) for m in messages])
        if not self.turns:
            return Completion(message={"role": "assistant", "content": "<think>done</think>done"})
        calls = self.turns.pop(0)
        message = {
            "role": "assistant",
            "content": "<think>acting</think>",
            "tool_calls": [call(n, a, f"c{len(self.seen)}-{i}") for i, (n, a) in enumerate(calls)],
        }
        return Completion(message=message, prompt_tokens=10, completion_tokens=5)


def runner(model: ChatModel, env_config: Any, **session: Any) -> SessionRunner:
    return SessionRunner(
        model=model, registry=load_registry([]), env_config=env_config, session=SessionConfig(**session)
    )


def write(path: str, content: str) -> tuple[str, dict[str, Any]]:
    return ("write_file", {"path": path, "content": content})


def shell(command: str) -> tuple[str, dict[str, Any]]:
    return ("terminal", {"command": command})
