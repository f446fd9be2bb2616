"""A validated prompt row and the sample built from it.

Identity (docs/resume.md): a sample's key hashes the row's canonical content (prompt, image, cwd, env,
toolsets, id) plus its occurrence index among identical rows, so two identical rows are two samples,
and reordering, inserting or deleting other rows never changes a sample's key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from raygen.input.verify_spec import VerifySpec
from raygen.tools.mcp_config import SERVER_NAME, McpServerConfig, unwrap_servers

ROW_FIELDS = (
    "prompt", "id", "category", "image", "cwd", "env", "toolsets", "metadata", "verify", "mcp_servers",
)  # fmt: skip


class PromptRow(BaseModel):
    """One line of the prompts JSONL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: StrictStr
    """The first user message, verbatim."""
    id: StrictStr | None = None
    """Unique in the file; becomes the record's ``id``."""
    category: StrictStr | None = None
    """The prompt's class, for per-class statistics."""
    image: StrictStr | None = None
    """Container image for sandboxed backends."""
    cwd: StrictStr | None = None
    """Working directory inside the environment."""
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    """Environment variables for the session's commands."""
    toolsets: list[StrictStr] | None = None
    """Toolsets for this row, overriding the distribution's draw."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Passed through untouched."""
    mcp_servers: dict[StrictStr, McpServerConfig] | None = None
    """MCP servers of this row only (the inner shape of ``mcpServers``), started before its first model
    call; their tools are added to what the row is offered."""
    verify: VerifySpec | None = None
    """The row's hidden check (``raygen/verify``). Not part of the sample's identity: fixing a flaky
    check keeps the samples, and ``raygen rescore`` grades them again."""

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("prompt is empty")
        return v

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _servers(cls, v: Any) -> Any:
        if v is None:
            return v
        servers = unwrap_servers(v, "mcp_servers")
        bad = [name for name in servers if not isinstance(name, str) or not SERVER_NAME.match(name)]
        if bad:
            raise ValueError(f"server name {bad[0]!r} must be 1-48 letters, digits, '_' or '-'")
        return servers

    @field_validator("cwd")
    @classmethod
    def _cwd_is_a_path(cls, v: str | None) -> str | None:
        # No path can hold a NUL byte; caught here it is this line's error, not a failed session.
        if v is not None and "\x00" in v:
            raise ValueError("contains a NUL character, which no path can hold")
        return v

    @field_validator("env")
    @classmethod
    def _env_is_settable(cls, v: dict[str, str]) -> dict[str, str]:
        # What execve accepts: a non-empty name without "=" or NUL, a value without NUL.
        for name, value in v.items():
            if not name:
                raise ValueError("a variable name is empty")
            if "=" in name or "\x00" in name:
                bad = "'='" if "=" in name else "a NUL character"
                raise ValueError(f"variable name {name!r} contains {bad}")
            if "\x00" in value:
                raise ValueError(f"the value of {name} contains a NUL character")
        return v

    def content_hash(self) -> str:
        canonical = {
            "prompt": self.prompt,
            "image": self.image,
            "cwd": self.cwd,
            "env": self.env,
            "toolsets": self.toolsets,
            "id": self.id,
        }
        if self.mcp_servers:  # only when set: rows without servers keep their keys
            canonical["mcp_servers"] = {k: v.model_dump(mode="json") for k, v in self.mcp_servers.items()}
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def make_sample_key(content_hash: str, occurrence: int) -> str:
    """Key of the ``occurrence``-th (0-based) row with this content hash."""
    return hashlib.sha256(f"{content_hash}:{occurrence}".encode()).hexdigest()[:24]


class Sample(BaseModel):
    """A row ready to run: its identity, position and the toolsets it is offered."""

    row: PromptRow
    sample_key: str
    prompt_index: int
    """0-based position among the valid rows of this run's dataset."""
    line: int
    """1-based line number in the dataset file (for messages)."""
    toolsets: list[str]
    attempt: int = 1
    group_id: str | None = None
    """Key shared by the samples of one row under ``--samples-per-prompt K`` (K > 1); else None."""
    sample_index: int = 0
    """0-based index of the sample within its group."""

    @property
    def record_id(self) -> str:
        return self.row.id if self.row.id is not None else self.sample_key
