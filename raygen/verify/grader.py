"""The grader: run a row's check against what the agent left behind, through the Environment seam.

Works on every backend (local, Docker, Modal, Singularity) because it only uses ``exec``,
``read_file`` and ``write_file``. Hidden files exist only here: nothing writes them before the agent
has finished, so the model can neither read nor edit them.

- ``fresh``: a new environment (same image, cwd and variables as the session's) receives the stored
  artifacts and then the hidden files; whatever else the agent changed is not there.
- ``same``: the hidden files are written over the agent's environment, then the command runs in it.

A check that cannot run (command timeout, grading environment lost or not startable, unreadable
reward) raises ``VerifyError``; the caller records it as the failure kind ``verify_error``, never as a
reward of 0.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from raygen.envs.base import Environment, ExecResult
from raygen.errors import SessionFailure
from raygen.formats.records import Artifact, Verification
from raygen.formats.text import cap_text
from raygen.input.verify_spec import MAX_ARTIFACT_BYTES, VerifySpec
from raygen.verify.python import PythonCheck, PythonCheckError, run_python_check

OUTPUT_MAX_CHARS = 4000
"""The check's output kept in the record: its head and tail, around a cut marker."""
_EXEC_MAX_CHARS = 64_000


class VerifyError(Exception):
    """The check could not run; ``verification`` tells what was seen up to then."""

    def __init__(self, message: str, verification: Verification):
        super().__init__(message, verification)
        self.message, self.verification = message, verification

    def __str__(self) -> str:
        return self.message


@dataclass
class Graded:
    """A check that ran: its reward (in [0, 1]) and what the record keeps of it."""

    reward: float
    verification: Verification
    artifacts: list[Artifact] = field(default_factory=list)


OpenEnvironment = Callable[[], AbstractAsyncContextManager[Environment]]
"""Starts a fresh grading environment (``async with``)."""


async def collect_artifacts(env: Environment | None, spec: VerifySpec) -> tuple[list[Artifact], list[str]]:
    """Read the declared artifacts out of the agent's environment: ``(found, missing paths)``."""
    found: list[Artifact] = []
    missing: list[str] = []
    for path in spec.artifacts:
        if env is None:  # the agent never used a tool: it left nothing behind
            missing.append(path)
            continue
        try:
            data = await env.read_file(path)
        except OSError:  # not there, a directory, unreadable: the agent did not leave the file
            missing.append(path)
            continue
        if len(data) > MAX_ARTIFACT_BYTES:
            missing.append(path)
            continue
        found.append(encode_artifact(path, data))
    return found, missing


def encode_artifact(path: str, data: bytes) -> Artifact:
    try:
        return Artifact(path=path, content=data.decode("utf-8"))
    except UnicodeDecodeError:
        return Artifact(path=path, content=base64.b64encode(data).decode("ascii"), encoding="base64")


def decode_artifact(artifact: Artifact) -> bytes:
    """The artifact's bytes; ValueError if its stored base64 is damaged (``encode_artifact`` never
    writes any other)."""
    if artifact.encoding == "base64":
        return base64.b64decode(artifact.content, validate=True)
    return artifact.content.encode("utf-8")


async def grade(
    spec: VerifySpec,
    *,
    agent_env: Environment | None,
    open_fresh: OpenEnvironment,
    artifacts: list[Artifact] | None = None,
    missing: list[str] | None = None,
    messages: list[dict[str, Any]] | None = None,
    model: Any = None,
) -> Graded:
    """Run the check. ``artifacts``/``missing`` default to what ``agent_env`` holds (``rescore`` passes
    the stored ones and no agent environment). ``same`` mode without an agent environment (the agent
    never ran a tool) grades in a fresh one, which is what the agent left: nothing."""
    started = time.monotonic()
    mode = spec.resolved_mode
    if artifacts is None:
        artifacts, missing = await collect_artifacts(agent_env, spec)
    verification = Verification(mode=mode, missing_artifacts=list(missing or ()))
    try:
        if mode == "same" and agent_env is not None:
            result, reward = await _check(
                agent_env, spec, [], PythonCheck(agent_env, messages or [], spec, model)
            )
        else:
            async with open_fresh() as env:
                result, reward = await _check(
                    env, spec, artifacts, PythonCheck(env, messages or [], spec, model)
                )
    except _CheckFailed as exc:
        verification.exit_code = exc.result.exit_code if exc.result else None
        verification.output = _output(exc.result) if exc.result else ""
        verification.duration_s = round(time.monotonic() - started, 4)
        verification.error = exc.message
        raise VerifyError(exc.message, verification) from None
    except SessionFailure as exc:  # the grading environment could not start or died
        verification.duration_s = round(time.monotonic() - started, 4)
        verification.error = f"grading environment: {exc}"
        raise VerifyError(verification.error, verification) from None
    verification.exit_code = result.exit_code
    verification.output = _output(result)
    verification.passed = reward >= spec.pass_threshold
    verification.duration_s = round(time.monotonic() - started, 4)
    return Graded(reward=reward, verification=verification, artifacts=artifacts)


class _CheckFailed(Exception):
    def __init__(self, message: str, result: ExecResult | None = None):
        super().__init__(message)
        self.message, self.result = message, result


async def _check(
    env: Environment, spec: VerifySpec, artifacts: list[Artifact], context: PythonCheck
) -> tuple[ExecResult, float]:
    await _stage(env, spec, artifacts)
    if spec.python is not None:
        try:
            reward = await run_python_check(spec, context)
        except PythonCheckError as exc:
            raise _CheckFailed(str(exc)) from None
        return ExecResult(exit_code=0, stdout="", stderr=""), reward
    result = await _run(env, spec)
    return result, await _reward(env, spec, result)


async def _stage(env: Environment, spec: VerifySpec, artifacts: list[Artifact]) -> None:
    for artifact in artifacts:
        try:
            data = decode_artifact(artifact)
        except ValueError as exc:  # a record damaged on disk: this record's check, not the command
            raise _CheckFailed(f"the stored artifact {artifact.path} is damaged (base64: {exc})") from None
        await env.write_file(artifact.path, data)
    # Hidden files last, so they overwrite anything of the same name the agent left behind.
    for path, text in spec.files.items():
        await env.write_file(path, text.encode("utf-8"))
    if spec.result == "reward_file":
        # A reward file the agent wrote must not count: only the command may produce it.
        await env.exec(f"rm -f -- {_quote(spec.reward_file)}", 30, 1000)


async def _run(env: Environment, spec: VerifySpec) -> ExecResult:
    result = await env.exec(str(spec.command), spec.timeout_s, _EXEC_MAX_CHARS)
    if result.timed_out:
        raise _CheckFailed(f"the check timed out after {spec.timeout_s:g} s", result)
    return result


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


async def _reward(env: Environment, spec: VerifySpec, result: ExecResult) -> float:
    if spec.result == "exit_code":
        return 1.0 if result.exit_code == 0 else 0.0
    if spec.result == "last_line":
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        if not lines:
            raise _CheckFailed("the check printed no reward line", result)
        return parse_reward(lines[-1], "the last output line", result)
    try:
        raw = await env.read_file(spec.reward_file)
    except (FileNotFoundError, IsADirectoryError):
        raise _CheckFailed(f"the check wrote no reward file {spec.reward_file}", result) from None
    text = raw.decode("utf-8", errors="replace")
    if spec.reward_file.endswith(".json") or text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            raise _CheckFailed(f"{spec.reward_file} is not JSON", result) from None
        if not isinstance(value, dict) or "reward" not in value:
            raise _CheckFailed(f'{spec.reward_file} holds no "reward" key', result)
        text = str(value["reward"])
    return parse_reward(text, spec.reward_file, result)


def parse_reward(text: str, where: str, result: ExecResult | None = None) -> float:
    """A float in [0, 1] from ``text``; anything else is a check that could not be read (not a 0)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise _CheckFailed(f"{where} holds {text.strip()[:40]!r}, not a number in [0, 1]", result) from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise _CheckFailed(f"{where} holds {value!r}, outside [0, 1]", result)
    return value


def _output(result: ExecResult) -> str:
    text = result.stdout
    if result.stderr:
        text = f"{text}\n[stderr]\n{result.stderr}" if text else result.stderr
    capped, _ = cap_text(text, OUTPUT_MAX_CHARS)
    return capped
