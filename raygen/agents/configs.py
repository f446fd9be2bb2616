"""Configuration of the agent that runs a session (``agent:``), selected by ``type``.

``builtin`` is raygen's own loop (``raygen.session.agent``); every other type runs an agent harness as a
command inside the session's environment, its model calls going through raygen's proxy (docs/agents.md).
Re-exported by ``raygen.config``; ``docs/configuration.md`` is generated from these docstrings.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from raygen.config_section import Section as _Section


class BuiltinAgentConfig(_Section):
    """raygen's own agent loop: the model is offered the run's toolsets and raygen executes its calls."""

    type: Literal["builtin"] = "builtin"
    """Agent selector."""


class _HarnessOptions(_Section):
    """What every harness run as a command shares."""

    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the harness (after raygen's own ``RAYGEN_*``, ``OPENAI_*`` and
    ``ANTHROPIC_*``, which they cannot replace)."""
    python: str = "python3"
    """Python interpreter inside the session's environment that runs raygen's small forwarder in front of
    the harness (standard library only; it lets the harness reach the proxy without a network)."""
    output_tail_chars: int = Field(4000, ge=0)
    """How much of the end of the harness's stdout and stderr each record keeps (``agent``)."""


class CommandAgentConfig(_HarnessOptions):
    """Any agent harness, given as a shell command (``--agent-command 'CMD'``)."""

    type: Literal["command"] = "command"
    """Agent selector."""
    command: str
    """Shell command run in the session's working directory. ``{prompt}``, ``{prompt_file}``,
    ``{workdir}``, ``{model}`` and ``{base_url}`` are replaced by the row's prompt, a file holding it, the
    working directory, the model name and the proxy's OpenAI base URL, each quoted for the shell; the same
    values are in the environment (``RAYGEN_PROMPT``, ``RAYGEN_PROMPT_FILE``, ``RAYGEN_MODEL``,
    ``OPENAI_BASE_URL``, ...; docs/agents.md)."""


class HermesAgentConfig(_HarnessOptions):
    """Hermes Agent (PyPI ``hermes-agent``), one-shot: ``hermes chat -q PROMPT`` (``--agent hermes``)."""

    type: Literal["hermes"] = "hermes"
    """Agent selector."""
    executable: str = "hermes"
    """The ``hermes`` command inside the environment (a name on ``PATH`` or a path)."""
    toolsets: str | None = None
    """Hermes's ``--toolsets`` (comma-separated); unset: Hermes's default (``hermes-cli``)."""
    extra_args: list[str] = Field(default_factory=list)
    """Further arguments of ``hermes chat``."""


class MiniSweAgentConfig(_HarnessOptions):
    """mini-swe-agent (PyPI ``mini-swe-agent``): ``mini -y --exit-immediately -t PROMPT``
    (``--agent mini-swe-agent``)."""

    type: Literal["mini-swe-agent"] = "mini-swe-agent"
    """Agent selector."""
    executable: str = "mini"
    """The ``mini`` command inside the environment (a name on ``PATH`` or a path)."""
    config: str = "mini.yaml"
    """mini-swe-agent's config file (``-c``): a built-in name or a path inside the environment."""
    extra_args: list[str] = Field(default_factory=list)
    """Further arguments of ``mini``."""


class ClaudeCodeAgentConfig(_HarnessOptions):
    """Claude Code (npm ``@anthropic-ai/claude-code``), one-shot: ``claude -p PROMPT`` against the proxy's
    Anthropic Messages endpoint (``--agent claude-code``)."""

    type: Literal["claude-code"] = "claude-code"
    """Agent selector."""
    executable: str = "claude"
    """The ``claude`` command inside the environment (a name on ``PATH`` or a path; it needs ``node``)."""
    extra_args: list[str] = Field(default_factory=list)
    """Further arguments of ``claude``."""


class CodexAgentConfig(_HarnessOptions):
    """Codex (npm ``@openai/codex``), one-shot: ``codex exec PROMPT`` against the proxy's Responses endpoint
    (``--agent codex``)."""

    type: Literal["codex"] = "codex"
    """Agent selector."""
    executable: str = "codex"
    """The ``codex`` command inside the environment (a name on ``PATH`` or a path)."""
    extra_args: list[str] = Field(default_factory=list)
    """Further arguments of ``codex exec``."""


HarnessConfig = (
    CommandAgentConfig | HermesAgentConfig | MiniSweAgentConfig | ClaudeCodeAgentConfig | CodexAgentConfig
)
"""Every agent that runs as a command."""

AgentConfig = Annotated[
    BuiltinAgentConfig
    | CommandAgentConfig
    | HermesAgentConfig
    | MiniSweAgentConfig
    | ClaudeCodeAgentConfig
    | CodexAgentConfig,
    Field(discriminator="type"),
]
