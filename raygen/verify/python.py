"""Python verifiers: ``verify.python: "module:function"`` instead of a shell command.

The function gets a ``PythonCheck`` after the hidden files are staged in the grading environment, and
returns a reward in [0, 1] (or a bool: True is 1). It may be ``async``; a plain function runs in a
thread. It can run commands and read files in the grading environment (``check.env``), read the
conversation (``check.messages``) and call a judge model through ``check.model``. Raising, returning
anything else, or outrunning ``timeout_s`` is a check that could not run (``verify_error``), never a
reward of 0.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.base import Environment
from raygen.input.verify_spec import VerifySpec
from raygen.model.base import ChatModel


@dataclass
class PythonCheck:
    env: Environment
    """The grading environment (fresh, or the agent's in ``same`` mode), files already staged."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The session's OpenAI-format messages."""
    spec: VerifySpec | None = None
    model: ChatModel | None = None
    """The session's model client, paced by the run's governor like every session call: a judge
    (``await check.model.complete(messages, [])``). None under ``raygen rescore``, which calls no model."""


class PythonCheckError(Exception):
    """The verifier could not be loaded, raised, timed out or returned no reward."""


def load_verifier(path: str) -> Any:
    module_name, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise PythonCheckError(f"cannot load verifier {path}: {exc}") from None


async def run_python_check(spec: VerifySpec, check: PythonCheck) -> float:
    function = load_verifier(str(spec.python))
    try:
        async with asyncio.timeout(spec.timeout_s):
            if inspect.iscoroutinefunction(function):
                value = await function(check)
            else:
                value = await asyncio.to_thread(function, check)
    except TimeoutError:
        raise PythonCheckError(f"the verifier {spec.python} timed out after {spec.timeout_s:g} s") from None
    except Exception as exc:  # the verifier's bug: the check could not run
        raise PythonCheckError(f"the verifier {spec.python} raised {type(exc).__name__}: {exc}") from None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise PythonCheckError(f"the verifier {spec.python} returned {value!r}, not a reward in [0, 1]")
    return float(value)
