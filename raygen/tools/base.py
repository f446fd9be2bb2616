"""The Tool seam: a named function the model can call, executed against the session's environment.

Tool failures (bad arguments, a command that fails, a missing file) are *results*: ``ToolResult(ok=False)``
goes back to the model as the tool message. Only infrastructure failures raise (SessionFailure).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.base import Environment


@dataclass
class ToolResult:
    ok: bool
    content: str
    """What the model sees (usually a JSON object as text)."""
    error_kind: str | None = None
    """For failures: ``execution``, ``timeout``, ``invalid_arguments`` or ``hallucinated``."""

    @classmethod
    def json(cls, payload: dict[str, Any], ok: bool = True, error_kind: str | None = None) -> ToolResult:
        return cls(ok=ok, content=json.dumps(payload, ensure_ascii=False), error_kind=error_kind)

    @classmethod
    def error(cls, message: str, kind: str = "execution") -> ToolResult:
        return cls.json({"error": message}, ok=False, error_kind=kind)


@dataclass
class ToolContext:
    env: Environment
    output_max_chars: int = 16_000
    default_timeout_s: float = 60.0
    max_timeout_s: float = 600.0


class Tool(ABC):
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {}
    """JSON schema of the arguments object."""

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class Toolset:
    name: str
    tools: list[Tool] = field(default_factory=list)
    description: str = ""


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` within ``max_chars`` (errors and results often sit at the end)."""
    if len(text) <= max_chars:
        return text, False
    marker = f"\n... [{len(text) - max_chars} characters cut by raygen] ...\n"
    keep = max(0, max_chars - len(marker))
    head = keep // 2
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else ""), True
