"""The simulator's exploration of offered MCP tools (named ``<server>__<tool>``, as raygen offers them,
or ``mcp__<server>__<tool>`` as Claude Code does).

After its probe script, the scripted agent calls every offered MCP tool it has not called, once, in one
turn, with arguments made from the tool's JSON schema: each required property gets its default, its
first enum value, or a plausible value for its type and name (a timezone for ``*timezone``, ``.`` for a
path or repository, ``12:00`` for a time). So a run with MCP servers and no network model still calls
their tools, and the tool statistics show whether they work.
"""

from __future__ import annotations

from typing import Any

BUILTIN_TOOLS = frozenset({"terminal", "read_file", "write_file", "patch", "search_files"})

_BY_NAME = (
    ("timezone", "Europe/Berlin"),
    ("revision", "HEAD"),
    ("target", "HEAD"),
    ("time", "12:00"),
    ("repo", "."),
    ("path", "."),
    ("dir", "."),
    ("file", "README.md"),
    ("url", "http://127.0.0.1/"),
    ("message", "raygen simulator commit"),
    ("query", "raygen"),
    ("name", "raygen"),
)


def example_value(name: str, schema: Any) -> Any:
    """A value for property ``name`` that fits ``schema`` (its default, first enum value, or by type)."""
    schema = schema if isinstance(schema, dict) else {}
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        return max(1, schema.get("minimum", 1))
    if kind == "boolean":
        return False
    if kind == "array":
        item = schema.get("items") or {}
        return [example_value(name.rstrip("s"), item)] if schema.get("minItems") else []
    if kind == "object":
        return example_arguments(schema)
    lowered = name.lower()
    return next((value for key, value in _BY_NAME if key in lowered), "raygen")


def example_arguments(schema: Any) -> dict[str, Any]:
    """Arguments for a tool's parameter schema: its required properties only."""
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties") or {}
    return {name: example_value(name, properties.get(name)) for name in schema.get("required") or ()}


# Only in a folder that is no git work tree yet: a session that runs where a repository already is (a
# harness started in a checkout, a misconfigured workdir) must never write or commit into it. (Once it did:
# a test's session ran in this project's checkout and committed "# sim" over its README.)
GIT_SETUP = (
    "if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then git init -q . && "
    "git config user.email sim@raygen.invalid && git config user.name sim && echo '# sim' > README.md && "
    "git add README.md && git commit -q -m init && echo more >> README.md; fi; "
)


def setup_prefix(tools: list[dict[str, Any]]) -> str:
    """What the probe's shell command does first so that offered tools have something to work on: a git
    repository with one commit and a changed README.md in the session's folder when a git server's tools
    (``*git_*``) are offered, else nothing."""
    names = [str((t.get("function") or {}).get("name", "")) for t in tools if isinstance(t, dict)]
    return GIT_SETUP if any("git_" in name for name in names) else ""


def exploration_calls(tools: list[dict[str, Any]], called: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """One call of each offered MCP tool not called already, in offer order. A harness's own tools (Claude
    Code's ``Task``, Hermes's browser) are left alone: called with made-up arguments they start
    sub-agents or minutes-long work, which no script of the simulator asks for."""
    calls = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            continue
        name = fn.get("name")
        if name and "__" in name and name not in BUILTIN_TOOLS and name not in called:
            calls.append((name, example_arguments(fn.get("parameters"))))
    return calls
