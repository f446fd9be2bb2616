"""The sandbox-fleet seam: what a session asks before it creates a sandbox, and the limits per backend.

A session brackets the start of its environment with ``permit = await gate.acquire(key)``,
``gate.started(permit, ok=..., refused=...)`` and, when the environment is closed, ``gate.closed(permit)``.
The cluster-wide sandbox governor (``raygen.distributed.sandbox_governor``) implements the gate, so a
creation rate, a cap on sandboxes starting at once and a cap on live sandboxes hold across every worker;
``OpenSandboxGate`` admits everything (backends with no limits, tests without Ray).

A backend that is *refused* by its provider (Modal's rate errors, a Docker daemon that times out, an
Apptainer instance start that times out) raises ``SandboxRefused``: the session fails with the retryable
``env_start`` kind, and the governor learns its limits down from it, the way the model governor learns
from 429s.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from raygen.config_section import Section
from raygen.errors import SessionFailure


class FleetLimits(Section):
    """Cluster-wide limits on one backend's sandboxes, enforced by the sandbox governor (per node for
    backends whose sandboxes run on the node, per workspace for a cloud backend). Each limit is learned
    down when the backend refuses a creation and recovers slowly to the configured value."""

    creations_per_s: float | None = Field(None, gt=0)
    """Sandbox creations per second, across the cluster (Modal: 5/s by default, the documented limit of a
    workspace); unset: no rate limit."""
    max_starting: int | None = Field(None, ge=1)
    """Sandboxes being created at once (a Docker daemon's container start is CPU-bound: more at once only
    makes each slower); unset: no cap."""
    max_live: int | None = Field(None, ge=1)
    """Sandboxes alive at once (an account's cap); unset: no cap."""
    learn: bool = True
    """Lower the rate and the starting cap on refusals (rate errors, daemon timeouts), then recover."""

    def limits_anything(self) -> bool:
        return any(v is not None for v in (self.creations_per_s, self.max_starting, self.max_live))


class SandboxRefused(SessionFailure):
    """The backend refused to create a sandbox now (a rate limit, an overloaded daemon): raised as
    ``SandboxRefused("env_start", detail)``, retryable."""


class SandboxGate(Protocol):
    async def acquire(self, key: str) -> Any:
        """Wait until a sandbox for ``key`` (a backend, a node) may be created."""
        ...

    def started(self, permit: Any, *, ok: bool, refused: bool = False) -> None:
        """The creation ended: made (``ok``), failed, or refused by the backend (learn from it)."""
        ...

    def closed(self, permit: Any) -> None:
        """A sandbox that was made is gone."""
        ...


class OpenSandboxGate:
    """Admits every creation at once."""

    async def acquire(self, key: str) -> None:
        return None

    def started(self, permit: Any, *, ok: bool, refused: bool = False) -> None:
        return None

    def closed(self, permit: Any) -> None:
        return None
