"""Where the agent harnesses of the tests are installed (``.ci/agents-setup.sh``, run by ``make engines``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

AGENTS = Path(os.environ.get("RAYGEN_AGENTS_DIR", "/tmp/raygen-ci/agents"))
HERMES = AGENTS / "hermes" / "bin" / "hermes"
MINI = AGENTS / "mini-swe-agent" / "bin" / "mini"
CLAUDE = AGENTS / "npm" / "node_modules" / ".bin" / "claude"
CODEX = AGENTS / "npm" / "node_modules" / ".bin" / "codex"


def need(executable: Path) -> None:
    """Skip (naming the set-up step) when a harness is not installed: `make engines` installs them."""
    if not executable.exists():
        pytest.skip(f"{executable} missing: run .ci/agents-setup.sh {AGENTS} (part of make engines)")
