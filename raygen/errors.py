"""Exception types and the failure taxonomy.

Two tiers (see docs/architecture.md):
- tool failures are *not* exceptions here: tools return a failed ``ToolResult`` that the model sees;
- infrastructure and provider failures raise ``SessionFailure``; the session ends with the failure's
  ``exit_status`` recorded, and the run's retry policy decides whether the sample runs again.

Every exception keeps its constructor arguments in ``args`` so it pickles across Ray processes.
"""

from __future__ import annotations

# Failure kinds: the part after "error:" in a record's exit_status. ``RETRYABLE`` kinds are
# infrastructure problems that another attempt can fix; the others are final for that sample.
FAILURE_KINDS: dict[str, str] = {
    "rate_limited": "provider kept answering 429 after all retries",
    "provider_unavailable": "provider 5xx, timeout or connection error after all retries",
    "provider_auth": "provider rejected the API key (401/403)",
    "provider_bad_request": "provider rejected the request (400/404/422), e.g. unknown model",
    "provider_malformed": "provider answered with a body that is not a chat completion, after all retries",
    "reply_too_large": "a model reply was longer than session.max_reply_chars",
    "record_too_large": "the record outgrew session.max_record_bytes; its conversation was dropped",
    "context_length": "the conversation outgrew the model's context window",
    "env_start": "the environment (workdir, container, sandbox) could not be started",
    "env_lost": "the environment died while the session ran",
    "image_unavailable": "the row's image could not be found or pulled",
    "worker_lost": "the worker running the session died (actor or node lost)",
    "session_timeout": "the session ran longer than session.session_timeout_s",
    "internal": "a bug in raygen or a user tool; see the record's error field",
    "verify_error": "the row's check could not run (timeout, grading sandbox lost); never a reward of 0",
    "mcp_server_lost": "an MCP tool server of the session did not start, died or stopped answering",
    "budget_reached": "the run's --max-cost or --max-tokens was reached before the next model call",
    "session_cost_cap": "the session's next model call could take it past --max-session-cost",
    "agent_not_found": "the agent command (agent.type other than builtin) was not found in the environment",
    "agent_failed": "the agent command exited non-zero without a final answer",
    "agent_no_model_call": "the agent command exited without calling the model once",
    "agent_late_call": "the agent command called the model after its session ended (a leftover process)",
}
RETRYABLE: frozenset[str] = frozenset(
    {
        "rate_limited",
        "provider_unavailable",
        "provider_malformed",
        "env_start",
        "env_lost",
        "worker_lost",
        "verify_error",
        "mcp_server_lost",
        "budget_reached",
        "agent_failed",
    }
)
UNCOUNTED: frozenset[str] = frozenset({"budget_reached"})
"""Retryable kinds whose attempts do not count towards ``retry.max_attempts``: a run stopped at its budget
was not the sample's fault, so a resume with a larger budget runs it as if it had never been stopped."""


class RaygenError(Exception):
    """Base class for raygen's own errors."""


class ConfigError(RaygenError):
    """The configuration is invalid or refers to something that does not exist."""


class RecordFormatError(ConfigError):
    """A run folder holds records of a newer format than this raygen reads (a ConfigError: every command
    reports it in one line and exits 2)."""


class InputError(RaygenError):
    """The prompts file has invalid rows; ``problems`` lists them all (file, line, field)."""

    def __init__(self, message: str, problems: list | None = None):
        super().__init__(message, problems)
        self.message = message
        self.problems = problems or []

    def __str__(self) -> str:
        return self.message


class ClusterLost(RaygenError):
    """The Ray cluster lost a piece the whole run depends on (the run's control actor, with its node: the
    head's, or Ray itself). What is durable stays; ``--resume`` goes on once the cluster is back."""


class MissingExtraError(RaygenError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, extra: str, module: str):
        super().__init__(extra, module)
        self.extra, self.module = extra, module

    def __str__(self) -> str:
        return f'this backend needs the "{self.module}" package: pip install "raygen[{self.extra}]"'


class SessionFailure(RaygenError):
    """Ends a session with ``exit_status = "error:<kind>"``; ``kind`` is a key of FAILURE_KINDS."""

    def __init__(self, kind: str, detail: str = ""):
        if kind not in FAILURE_KINDS:
            kind, detail = "internal", f"unknown failure kind {kind!r}: {detail}"
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    @property
    def exit_status(self) -> str:
        return f"error:{self.kind}"

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def is_failure_status(exit_status: str) -> bool:
    return exit_status.startswith("error:")


def failure_kind(exit_status: str) -> str:
    return exit_status.split(":", 1)[1] if is_failure_status(exit_status) else ""
