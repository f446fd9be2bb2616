"""The simulator's coding script, for verified tasks: prompts that ask for a Python file.

Opt-in with ``sim.solutions_file`` (without it every prompt keeps the probe script of
``raygen.model.sim_policy``). A prompt in the form of ``../shared/datasets/verified-tasks.jsonl``
("Complete this Python function ... Write the whole function ... to solution.py ...:\\n\\n<code>") gets
a three-step session: write the file, import it in the shell (the agent "tests it"), answer. What it
writes decides the reward:

- the reference solution, when ``sim.solutions_file`` holds one for the prompt's code and the session's
  draw falls under ``sim.solve_rate``;
- otherwise the prompt's code as it stands (signature and docstring: the function returns None), which
  the hidden tests reject.

The draw hashes the seed, the prompt and the request's ``seed``, so the samples of one prompt group
(each sends its own seed) can differ while every run with the same seeds makes the same choices. The
script never sees the hidden tests: it works from the prompt alone, plus the solutions file, which is
test data (the reference solutions of ``verified-tasks.solutions.jsonl``), never a prompt.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygen.model.configs import SimConfig

_TARGET = re.compile(r"\bto (?P<path>[\w][\w./-]*\.py)\b")
_CODE_START = ":\n\n"


@dataclass(frozen=True)
class CodingTask:
    path: str
    """The file the prompt asks for, e.g. ``solution.py``."""
    code: str
    """The code the prompt gives (what a reference solution starts with)."""


@dataclass
class CodingStep:
    """The reply of one turn of the coding script."""

    calls: list[tuple[str, dict[str, Any]]]
    visible: str | None
    reasoning: str
    decision: dict[str, Any] = field(default_factory=dict)


def coding_task(prompt: str) -> CodingTask | None:
    """The task of a "write <file>.py" prompt with code after ``:\\n\\n``; None for any other prompt."""
    head, sep, code = prompt.partition(_CODE_START)
    match = _TARGET.search(head)
    if not sep or match is None or not code.strip():
        return None
    return CodingTask(path=match.group("path"), code=code)


@functools.lru_cache(maxsize=8)
def _solutions(path: str) -> tuple[str, ...]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line)["solution_py"] for line in lines if line.strip())


def reference_solution(task: CodingTask, cfg: SimConfig) -> str | None:
    """The solution in ``cfg.solutions_file`` that completes the prompt's code, if any."""
    if cfg.solutions_file is None:
        return None
    return next((s for s in _solutions(str(cfg.solutions_file)) if s.startswith(task.code)), None)


def solves(prompt: str, cfg: SimConfig, request_seed: int | str | None) -> bool:
    digest = hashlib.sha256(f"{cfg.seed}:solve:{request_seed}:{prompt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < cfg.solve_rate


def coding_step(
    prompt: str, offered: set[str], calls_so_far: list[str], cfg: SimConfig, request_seed: int | str | None
) -> CodingStep | None:
    """The next step for a coding prompt (None if the prompt is not one). ``calls_so_far``: names of the
    tools called in earlier turns."""
    if cfg.solutions_file is None:  # opt-in: without solutions every prompt gets the probe script
        return None
    task = coding_task(prompt)
    if task is None:
        return None
    if "write_file" not in calls_so_far and "write_file" in offered:
        reference = reference_solution(task, cfg)
        right = reference is not None and solves(prompt, cfg, request_seed)
        content = reference if right and reference is not None else task.code
        return CodingStep(
            calls=[("write_file", {"path": task.path, "content": content})],
            visible=None,
            reasoning=f"I will write the whole function to {task.path}.",
            decision={"action": "write_solution", "solution": "reference" if right else "stub"},
        )
    if "terminal" not in calls_so_far and "terminal" in offered:
        module = task.path.removesuffix(".py").replace("/", ".")
        return CodingStep(
            calls=[("terminal", {"command": f"python3 -c 'import {module}' && echo imports-ok"})],
            visible=None,
            reasoning=f"Now I check that {task.path} at least imports.",
            decision={"action": "test_solution"},
        )
    return CodingStep(
        calls=[],
        visible=f"I wrote the function to {task.path}.",
        reasoning="The file is written; I am done.",
        decision={"action": "final"},
    )
