"""The rate-gate seam between a model client and the cluster-wide governor.

Every HTTP request to the provider is bracketed by ``permit = await gate.acquire(est_tokens)`` and
``gate.release(permit, ...)``. The governor (raygen.distributed.governor) implements it with leases
from a Ray actor; ``OpenGate`` is used when no limits are configured and in Ray-free tests.
"""

from __future__ import annotations

from typing import Protocol

Permit = object
"""What ``acquire`` returned, handed back to ``release`` unread by the caller: each gate its own token."""


class RateGate(Protocol):
    async def acquire(self, est_tokens: int) -> Permit:
        """Wait until a request of about ``est_tokens`` (prompt + completion) may be sent."""
        ...

    def release(
        self,
        permit: Permit,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        status: int | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Report how the request went: ``status`` is the HTTP status (None for a connection error or
        timeout), ``retry_after_s`` the provider's Retry-After, ``headers`` its ``x-ratelimit-*`` headers."""
        ...


class OpenGate:
    """Admits everything at once."""

    async def acquire(self, est_tokens: int) -> None:
        return None

    def release(self, permit: Permit, **_: object) -> None:
        return None
