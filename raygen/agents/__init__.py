"""Agents other than raygen's own loop: any harness run as a command in the session's environment, its
model calls served and recorded by raygen's proxy (docs/agents.md)."""

from __future__ import annotations

from typing import Any

from raygen.agents.base import Harness, HarnessRun, RecordedCall, Seat


def create_harness(config: Any) -> Harness | None:
    """The harness of an ``agent:`` config; None for ``builtin`` (raygen's own loop)."""
    if config is None or config.type == "builtin":
        return None
    from raygen.agents.command import CommandHarness

    return CommandHarness(config)


__all__ = ["Harness", "HarnessRun", "RecordedCall", "Seat", "create_harness"]
