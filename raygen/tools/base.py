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
from raygen.formats.text import cap_text


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
    mcp: Any = None
    """The session's MCP servers (``raygen.tools.mcp_tools.McpSessionServers``), if it has any."""


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


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def _json_type_name(value: object) -> str:
    # bool before integer: True is an int in Python but never a number in JSON schema
    if value is None:
        return "null"
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if isinstance(value, _JSON_TYPES[name]):
            return name
    return type(value).__name__


def check_arguments(parameters: dict[str, Any], args: object) -> str | None:
    """Check ``args`` against a flat JSON schema (required keys, top-level types); None when valid.

    The message is meant for the model, e.g. ``"missing required argument 'path'"``. An optional argument
    given as null counts as absent (models often send ``"timeout": null``).
    """
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    properties = parameters.get("properties", {})
    for name in parameters.get("required", []):
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        expected = properties.get(name, {}).get("type")
        expected = expected if isinstance(expected, str) and expected in _JSON_TYPES else None
        if name not in properties and parameters.get("additionalProperties") is False:
            return f"unknown argument {name!r}"
        if value is None and name not in parameters.get("required", []):
            continue
        actual = _json_type_name(value)
        if expected and actual != expected and (expected, actual) != ("number", "integer"):
            return f"argument {name!r} must be of type {expected}, got {actual}"
    return None


def fit_json(payload: dict[str, Any], field: str, max_chars: int) -> bool:
    """Shorten the text ``payload[field]`` (head and tail kept, via cap_text) until the whole payload's JSON
    fits in ``max_chars``, so a tool result is never cut again, mid-JSON, by the session. True if cut."""
    cut = False
    for _ in range(8):
        size = len(json.dumps(payload, ensure_ascii=False))
        text = payload[field]
        if size <= max_chars or not text:
            return cut
        # JSON escapes (\n, \", ...) make the encoded text longer than the text: shrink proportionally.
        escaped = len(json.dumps(text, ensure_ascii=False)) - 2
        target = int((len(text) - (size - max_chars) * len(text) / max(escaped, 1)) * 0.98)
        payload[field], shortened = cap_text(text, max(0, target))
        cut = cut or shortened
    return cut
