"""The ``file`` toolset: read_file, write_file, patch and search_files.

Every tool acts only through the Environment interface (read_file / write_file / exec), so it works on
every backend. A missing file, a failed command or an ambiguous patch is a failed ToolResult the model
sees (``error_kind="execution"``), never an exception; bad arguments give ``invalid_arguments``.
"""

from __future__ import annotations

import json
import re
import shlex
from abc import abstractmethod
from typing import Any

from raygen.tools.base import Tool, ToolContext, ToolResult, Toolset, check_arguments, fit_json

_PATH = {"type": "string", "description": "File path, relative to the working directory or absolute."}


def _describe_os_error(exc: OSError, path: str) -> str:
    # The model's own path, not the host path in exc.filename (it may reveal the backend's layout).
    if isinstance(exc, FileNotFoundError):
        return f"{path}: no such file or directory"
    if isinstance(exc, IsADirectoryError):
        return f"{path}: is a directory"
    if isinstance(exc, PermissionError):
        return f"{path}: permission denied"
    return f"{path}: {exc.strerror or exc}"


class _FileTool(Tool):
    """Shared argument checking and OSError-to-result mapping."""

    def validate(self, args: dict[str, Any]) -> str | None:
        """Extra checks beyond the schema's types; a message for the model, or None."""
        return None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        problem = check_arguments(self.parameters, args) or self.validate(args)
        if problem:
            return ToolResult.error(problem, kind="invalid_arguments")
        try:
            return await self.act(args, ctx)
        except OSError as exc:
            return ToolResult.error(_describe_os_error(exc, args.get("path") or "."), kind="execution")

    @abstractmethod
    async def act(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


class ReadFileTool(_FileTool):
    """``read_file(path, offset?, limit?)`` -> ``{"content", "total_lines", "truncated"[, "binary"]}``."""

    name = "read_file"
    description = (
        "Read a text file. Optionally start at line `offset` (1-based) and return at most `limit` lines. "
        "If the result is truncated, `next_offset` tells where to continue."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "offset": {"type": "integer", "description": "First line to return, 1-based (default 1)."},
            "limit": {"type": "integer", "description": "Most lines to return (default: all that fit)."},
        },
        "required": ["path"],
    }

    def validate(self, args: dict[str, Any]) -> str | None:
        for name in ("offset", "limit"):
            if args.get(name) is not None and args[name] < 1:
                return f"argument {name!r} must be at least 1"
        return None

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        data = await ctx.env.read_file(args["path"])
        try:
            text, binary = data.decode("utf-8"), False
        except UnicodeDecodeError:
            text, binary = data.decode("utf-8", "replace"), True
        lines = text.splitlines(keepends=True)
        start = (args.get("offset") or 1) - 1
        limit = args.get("limit")
        window = lines[start : start + limit if limit else None]
        # Whole lines while they fit (JSON-escaped size), so `next_offset` can continue exactly.
        budget, shown, used = ctx.output_max_chars - 160, 0, 0
        for line in window:
            used += len(json.dumps(line, ensure_ascii=False)) - 2
            if used > budget and shown:
                break
            shown += 1
        payload: dict[str, Any] = {"content": "".join(window[:shown]), "total_lines": len(lines)}
        payload["truncated"] = start + shown < len(lines)
        if binary:
            payload["binary"] = True
        if fit_json(payload, "content", ctx.output_max_chars):  # one line longer than the whole budget
            payload["truncated"] = True
        if start + shown < len(lines):
            payload["next_offset"] = start + shown + 1
        return ToolResult.json(payload)


class WriteFileTool(_FileTool):
    """``write_file(path, content)`` -> ``{"bytes_written"}``; parent directories are created."""

    name = "write_file"
    description = "Create or overwrite a file with the given text content (parent directories are created)."
    parameters = {
        "type": "object",
        "properties": {"path": _PATH, "content": {"type": "string", "description": "The full new content."}},
        "required": ["path", "content"],
    }

    def validate(self, args: dict[str, Any]) -> str | None:
        return "argument 'path' is empty" if not args["path"] else None

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            data = args["content"].encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates from a "\ud800" JSON escape
            return ToolResult.error(f"content is not valid Unicode: {exc.reason}", kind="invalid_arguments")
        await ctx.env.write_file(args["path"], data)
        return ToolResult.json({"bytes_written": len(data)})


class PatchTool(_FileTool):
    """``patch(path, old_string, new_string)`` -> ``{"replacements": 1}``; old_string must occur once."""

    name = "patch"
    description = (
        "Replace one exact occurrence of `old_string` in a text file with `new_string`. `old_string` must "
        "occur exactly once: include enough surrounding lines to make it unique."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": _PATH,
            "old_string": {"type": "string", "description": "Exact text to replace (must be unique)."},
            "new_string": {"type": "string", "description": "Replacement text."},
        },
        "required": ["path", "old_string", "new_string"],
    }

    def validate(self, args: dict[str, Any]) -> str | None:
        return "argument 'old_string' is empty" if not args["old_string"] else None

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path, old, new = args["path"], args["old_string"], args["new_string"]
        try:
            text = (await ctx.env.read_file(path)).decode("utf-8")
        except UnicodeDecodeError:
            return ToolResult.error(f"{path}: not a UTF-8 text file", kind="execution")
        # Overlapping matches count too: "aa" in "aaa" is ambiguous.
        matches = len(re.findall(f"(?={re.escape(old)})", text))
        if matches != 1:
            where = "not found" if matches == 0 else f"found {matches} times; include more context"
            return ToolResult.error(f"old_string {where} in {path}", kind="execution")
        try:
            data = text.replace(old, new, 1).encode("utf-8")
        except UnicodeEncodeError as exc:
            return ToolResult.error(
                f"new_string is not valid Unicode: {exc.reason}", kind="invalid_arguments"
            )
        await ctx.env.write_file(path, data)
        return ToolResult.json({"replacements": 1})


class SearchFilesTool(_FileTool):
    """``search_files(pattern, path?)`` -> ``{"matches", "count"}`` via ``grep -rnIE`` in the environment."""

    name = "search_files"
    description = (
        "Search file contents recursively for an extended regular expression (grep -E syntax). Returns "
        "matching lines as `file:line:text`; binary files are skipped."
    )
    parameters = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Extended regular expression."},
            "path": {"type": "string", "description": "File or directory to search (default: working dir)."},
        },
        "required": ["pattern"],
    }

    def validate(self, args: dict[str, Any]) -> str | None:
        return "argument 'pattern' is empty" if not args["pattern"] else None

    async def act(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        grep = f"grep -rnIE -e {shlex.quote(args['pattern'])} -- {shlex.quote(args.get('path') or '.')}"
        result = await ctx.env.exec(
            grep, timeout_s=ctx.default_timeout_s, max_output_chars=ctx.output_max_chars
        )
        if result.timed_out:
            return ToolResult.error(f"search timed out after {ctx.default_timeout_s:g} s", kind="timeout")
        if result.exit_code == 1 or (result.exit_code == 0 and not result.stdout):
            return ToolResult.json({"matches": "", "count": 0})
        # grep exits 2 on any error (e.g. one unreadable file) even when it found matches elsewhere.
        if result.exit_code not in (0, 2) or not result.stdout:
            message = (result.stderr or result.stdout).strip() or f"grep exited with {result.exit_code}"
            return ToolResult.error(message, kind="execution")
        count = result.stdout.count("\n")
        if result.truncated:  # the output was cut: count the matches separately
            counted = await ctx.env.exec(f"{grep} | wc -l", ctx.default_timeout_s, 100)
            count = int(counted.stdout.strip()) if counted.stdout.strip().isdigit() else count
        payload: dict[str, Any] = {"matches": result.stdout, "count": count}
        if result.exit_code == 2:
            payload["warnings"] = result.stderr[:500]
        payload["truncated"] = True
        if not (fit_json(payload, "matches", ctx.output_max_chars) or result.truncated):
            del payload["truncated"]
        return ToolResult.json(payload)


def file_toolset() -> Toolset:
    """A fresh ``file`` toolset."""
    return Toolset(
        name="file",
        tools=[ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool()],
        description="Read, write, patch and search files.",
    )
