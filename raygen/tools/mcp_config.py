"""MCP tool servers as configured: the ``{"mcpServers": {NAME: {...}}}`` JSON that MCP clients share.

A stdio server is ``{"command", "args", "env", "cwd"}`` and runs inside the session's environment; an
HTTP server is ``{"url", "headers", "type": "http" | "sse"}``. Values may reference the driver's
environment as ``${VAR}``: such values are secrets, resolved only where a server is started (the driver's
pre-flight, the session actors through ``WorkerPlan.mcp_env``), scrubbed from every record and never
written to the manifest, which keeps the ``${VAR}`` form.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from raygen.config_section import Section
from raygen.errors import ConfigError

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
"""A server's name becomes a toolset name and the prefix of its tool names (``<server>__<tool>``)."""
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_IGNORED_CLIENT_KEYS = ("autoApprove", "alwaysAllow", "timeout", "description")
"""Keys other MCP clients write into the same JSON; accepted so a user's file works unchanged."""


class McpServerConfig(Section):
    """One MCP server: ``command`` (stdio, run inside the session's environment) or ``url`` (HTTP)."""

    command: str | None = None
    """The program of a stdio server, found on the environment's PATH (or an absolute path in it)."""
    args: list[str] = Field(default_factory=list)
    """Its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the server's environment (``${VAR}`` reads the driver's; a secret)."""
    cwd: str | None = None
    """Working directory of the server inside the environment; default the session's cwd."""
    url: str | None = None
    """The endpoint of an HTTP server (streamable HTTP, or SSE with ``type: sse``)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent to a ``url`` server (``${VAR}`` reads the driver's; a secret)."""
    type: Literal["stdio", "http", "streamable-http", "streamable_http", "sse"] | None = None
    """The transport; default ``stdio`` with ``command``, ``http`` with ``url``."""
    shared: bool = False
    """Run one server per session actor process instead of one per session (stateless servers only: a
    shared server runs on the actor's host in a scratch folder, not in a session's sandbox)."""
    disabled: bool = False
    """Skip this server (other MCP clients' key)."""
    tools: list[str] | None = None
    """Offer only these of the server's tools (by their MCP name); default all."""

    @model_validator(mode="before")
    @classmethod
    def _drop_client_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if key not in _IGNORED_CLIENT_KEYS}
        return data

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("give exactly one of 'command' (a stdio server) or 'url' (an HTTP server)")
        if self.command and self.type not in (None, "stdio"):
            raise ValueError(f"type {self.type!r} needs a 'url', not a 'command'")
        if self.url and self.type == "stdio":
            raise ValueError("type 'stdio' needs a 'command', not a 'url'")
        if self.url and self.shared:
            raise ValueError("'shared' is for stdio servers; an HTTP server is reached by its URL anyway")
        return self

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v

    @property
    def transport(self) -> str:
        """``stdio``, ``http`` or ``sse``."""
        if self.command:
            return "stdio"
        return "sse" if self.type == "sse" else "http"

    @property
    def placement(self) -> str:
        """Where the server runs: ``session`` (in the session's environment), ``actor`` (one per actor
        process, ``shared``) or ``remote`` (an HTTP server reached by URL)."""
        if self.url:
            return "remote"
        return "actor" if self.shared else "session"

    def references(self) -> set[str]:
        """The driver variables its values name as ``${VAR}``."""
        texts = [self.command or "", *self.args, *self.env.values(), self.cwd or "", self.url or ""]
        texts += list(self.headers.values())
        return {name for text in texts for name in _REFERENCE.findall(text)}

    def resolved(self, values: Mapping[str, str]) -> McpServerConfig:
        """A copy with every ``${VAR}`` replaced from ``values``; ConfigError naming an unset one."""

        def sub(text: str) -> str:
            def one(match: re.Match[str]) -> str:
                name = match.group(1)
                if name not in values:
                    raise ConfigError(f"MCP server config references ${{{name}}}, which is not set")
                return values[name]

            return _REFERENCE.sub(one, text)

        return self.model_copy(
            update={
                "command": sub(self.command) if self.command else None,
                "args": [sub(a) for a in self.args],
                "env": {k: sub(v) for k, v in self.env.items()},
                "cwd": sub(self.cwd) if self.cwd else None,
                "url": sub(self.url) if self.url else None,
                "headers": {k: sub(v) for k, v in self.headers.items()},
            }
        )


def unwrap_servers(data: Any, source: str) -> dict[str, Any]:
    """``{"mcpServers": {...}}`` (or the inner mapping itself) -> the mapping of servers by name."""
    if isinstance(data, dict) and set(data) == {"mcpServers"}:
        data = data["mcpServers"]
    elif isinstance(data, dict) and "mcpServers" in data:
        extra = sorted(set(data) - {"mcpServers"})
        raise ConfigError(f"{source}: unexpected key(s) beside mcpServers: {', '.join(extra)}")
    if not isinstance(data, dict):
        raise ConfigError(
            f'{source}: expected {{"mcpServers": {{NAME: {{...}}}}}}, got {type(data).__name__}'
        )
    return data


def parse_servers(data: Any, source: str) -> dict[str, McpServerConfig]:
    """Validate a servers mapping (either shape); ConfigError naming the source, server and field."""
    servers: dict[str, McpServerConfig] = {}
    for name, spec in unwrap_servers(data, source).items():
        if not isinstance(name, str) or not SERVER_NAME.match(name):
            raise ConfigError(
                f"{source}: MCP server name {name!r} must be 1-48 letters, digits, '_' or '-' "
                "(it becomes a toolset name and a tool-name prefix)"
            )
        try:
            server = McpServerConfig.model_validate(spec)
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or name}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ConfigError(f"{source}: MCP server {name!r}: {details}") from None
        if not server.disabled:
            servers[name] = server
    return servers


def load_server_file(path: str | Path) -> dict[str, McpServerConfig]:
    """The servers of one ``--mcp-config`` file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read MCP config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"MCP config {path} is not valid JSON: {exc}") from None
    return parse_servers(data, str(path))


def configured_servers(
    inline: Mapping[str, McpServerConfig], files: Iterable[str | Path]
) -> dict[str, McpServerConfig]:
    """The run's servers: ``tools.mcp_servers`` and then each ``--mcp-config`` file (a name defined twice
    is an error, not a silent override)."""
    servers = {name: server for name, server in inline.items() if not server.disabled}
    for path in files:
        for name, server in load_server_file(path).items():
            if name in servers:
                raise ConfigError(f"MCP server {name!r} of {path} is already defined")
            servers[name] = server
    return servers


def referenced_values(
    servers: Iterable[McpServerConfig],
    extra_names: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The driver's values of every variable the servers reference (ConfigError for an unset one), plus
    those of ``extra_names`` that are set (rows' servers may reference them)."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for server in servers:
        for name in sorted(server.references()):
            if name not in environ:
                raise ConfigError(f"MCP server config references ${{{name}}}, which is not set")
            values[name] = environ[name]
    values.update({name: environ[name] for name in extra_names if environ.get(name)})
    return values


def tool_name(name_format: str, server: str, tool: str) -> str:
    """The name the model calls: ``tools.mcp_tool_name_format`` with ``{server}`` and ``{tool}``; only the
    characters OpenAI-style function names allow (others become ``_``), at most 64."""
    raw = name_format.format(server=server, tool=tool)
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:64]
