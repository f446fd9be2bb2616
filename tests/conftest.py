"""Shared fixtures. Tests that start Ray are marked ``ray``; CI runs them in a loopback-only namespace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# 589 real task prompts, vendored from ../shared/datasets so a plain clone runs every test (licence: the
# .LICENSE.md beside it).
AGENT_TASKS = ROOT / "tests" / "data" / "agent-tasks.jsonl"
EXAMPLES = ROOT / "examples" / "prompts.jsonl"

# Never let a test reach a hub, a cloud metadata service or the real Modal.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def agent_tasks() -> Path:
    return AGENT_TASKS
