"""Shared pieces of the MCP tests: real servers from PyPI (mcp-server-time, mcp-server-git), the
misbehaving scripted server, and a session runner with MCP toolsets."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from raygen.config import SessionConfig, ToolsConfig
from raygen.input.rows import PromptRow, Sample
from raygen.model.base import ChatModel, Completion
from raygen.session.agent import SessionRunner
from raygen.tools.mcp_config import parse_servers
from raygen.tools.mcp_preflight import preflight_servers
from raygen.tools.mcp_session import McpSettings
from raygen.tools.mcp_tools import mcp_toolset
from raygen.tools.registry import load_registry

SERVERS = Path(__file__).parent / "servers"
SCRIPTED = str(SERVERS / "scripted_server.py")
PY = sys.executable


def time_server() -> dict[str, Any]:
    return {"command": PY, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def git_server() -> dict[str, Any]:
    return {"command": PY, "args": ["-m", "mcp_server_git"]}


def scripted(*modes: str) -> dict[str, Any]:
    return {"command": PY, "args": [SCRIPTED, *modes]}


def venv_binds() -> list[str]:
    """What a bwrap sandbox must show for this interpreter and its packages to run in it."""
    return sorted({sys.prefix, sys.base_prefix, str(SERVERS)})


class ListModel(ChatModel):
    """Replies with the given assistant messages in order (a double of the Model seam)."""

    name = "list-model"

    def __init__(self, replies: list[dict[str, Any]]):
        self.replies = list(replies)
        self.seen_tools: list[list[dict[str, Any]]] = []

    async def complete(self, messages, tools) -> Completion:
        self.seen_tools.append(tools)
        return Completion(message=self.replies.pop(0), prompt_tokens=10, completion_tokens=5)


def call(name: str, args: dict[str, Any], cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


DONE = {"role": "assistant", "content": "done"}


def sample(toolsets: list[str], key: str = "k", **row: Any) -> Sample:
    return Sample(
        row=PromptRow(prompt="use the tools", **row),
        sample_key=key * (24 // len(key)),
        prompt_index=0,
        line=1,
        toolsets=toolsets,
    )


async def mcp_runner(
    servers: dict[str, Any],
    env_config: Any,
    model: ChatModel,
    values: dict[str, str] | None = None,
    **tools: Any,
) -> SessionRunner:
    """A runner whose registry holds the servers' toolsets, as the driver's pre-flight lists them."""
    tools_config = ToolsConfig(**tools)
    parsed = parse_servers({"mcpServers": servers}, "test")
    listings = await preflight_servers(
        parsed,
        values or {},
        env_config,
        run_name="mcp-test",
        name_format=tools_config.mcp_tool_name_format,
        start_timeout_s=tools_config.mcp_start_timeout_s,
    )
    registry = load_registry([])
    for listing in listings:
        registry.add(mcp_toolset(listing))
    return SessionRunner(
        model=model,
        registry=registry,
        env_config=env_config,
        session=SessionConfig(),
        mcp=McpSettings.of(tools_config, listings, values or {}),
        secret_values=list((values or {}).values()),
    )


def tool_messages(record: Any) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in record.messages if m["role"] == "tool"}


def processes_inside(folder: Path) -> list[str]:
    """Command lines of live processes working inside ``folder`` (what a session's servers would be)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if cwd == str(folder) or cwd.startswith(f"{folder}/"):
            found.append(cmdline)
    return found


def assert_none_inside(folder: Path, wait_s: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + wait_s
    while (left := processes_inside(folder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind in {folder}: {left}"
