"""The ``terminal`` toolset: run a shell command in the session's environment."""

from __future__ import annotations

from typing import Any

from raygen.formats.text import cap_text
from raygen.tools.base import Tool, ToolContext, ToolResult, Toolset, check_arguments, fit_json

MAX_COMMAND_BYTES = 128 * 1024 - 1
"""Longest command line (UTF-8 bytes): Linux refuses a longer single argument to a program (E2BIG,
MAX_ARG_STRLEN), on every backend. A longer command is the model's mistake, shown to it, not a lost
environment; large content belongs in ``write_file``."""


class TerminalTool(Tool):
    """``terminal(command, timeout?)`` -> ``{"output", "exit_code"[, "timed_out"][, "truncated"]}``."""

    name = "terminal"
    description = (
        "Run a bash command in the working directory and return its combined stdout and stderr and its exit "
        "code. Each call starts a fresh shell (cd and variables do not persist); stdin is empty, so avoid "
        "interactive programs. Long output is cut in the middle."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command line to run."},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command and all its children are killed.",
            },
        },
        "required": ["command"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        problem = check_arguments(self.parameters, args)
        if problem is None:
            problem = _command_problem(args["command"])
        timeout = args.get("timeout")
        if problem is None and timeout is not None and not timeout > 0:  # "not >" also refuses NaN
            problem = "argument 'timeout' must be positive"
        if problem:
            return ToolResult.error(problem, kind="invalid_arguments")
        timeout_s = min(float(timeout if timeout is not None else ctx.default_timeout_s), ctx.max_timeout_s)
        result = await ctx.env.exec(
            args["command"], timeout_s=timeout_s, max_output_chars=ctx.output_max_chars
        )
        joiner = "\n" if result.stdout and result.stderr and not result.stdout.endswith("\n") else ""
        output, cut = cap_text(result.stdout + joiner + result.stderr, ctx.output_max_chars)
        payload: dict[str, Any] = {"output": output, "exit_code": result.exit_code}
        if result.timed_out:
            payload["timed_out"] = True
        payload["truncated"] = True  # present while fitting, so the flag's own characters are counted
        cut = fit_json(payload, "output", ctx.output_max_chars) or cut or result.truncated
        if not cut:
            del payload["truncated"]
        if result.timed_out:
            return ToolResult.json(payload, ok=False, error_kind="timeout")
        if result.exit_code != 0:
            return ToolResult.json(payload, ok=False, error_kind="execution")
        return ToolResult.json(payload)


def _command_problem(command: str) -> str | None:
    if not command.strip():
        return "argument 'command' is empty"
    if "\x00" in command:
        return "argument 'command' contains a NUL character, which no shell command can hold"
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        return (
            f"argument 'command' is {size} bytes, over the {MAX_COMMAND_BYTES}-byte limit of one command "
            "line; write large content with write_file and run a short command on it"
        )
    return None


def terminal_toolset() -> Toolset:
    """A fresh ``terminal`` toolset (tools are stateless; per-session state lives in the ToolContext)."""
    return Toolset(name="terminal", tools=[TerminalTool()], description="Run shell commands.")
