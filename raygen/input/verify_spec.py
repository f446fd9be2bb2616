"""The check spec: a row's ``verify`` object (and the config-level default for rows without one).

The form follows ``../shared/datasets/verified-tasks.README.md``::

    {"files": {"test_hidden.py": "..."}, "command": "python3 test_hidden.py", "timeout_s": 30,
     "artifacts": ["solution.py"]}

and adds ``result`` (how to read the outcome), ``reward_file``, ``pass_threshold`` and ``mode``.
Paths are relative to the session's working directory and may not climb out of it: on the local
backend an absolute path would be a host path, and a staged file must never land outside the sandbox.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

ResultKind = Literal["exit_code", "reward_file", "last_line"]
Mode = Literal["same", "fresh"]

MAX_ARTIFACT_BYTES = 1 << 20
"""An artifact larger than this is not stored with the record (and the check fails as missing)."""


def check_relative_path(path: str) -> str:
    """``path`` normalised, or ValueError if it is absolute, empty or climbs out with ``..``."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ValueError(f"{path!r} must be a relative path inside the working directory")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        raise ValueError(f"{path!r} must be a relative path inside the working directory")
    return norm


class RelativePath(str):
    """A string path checked by ``check_relative_path`` (a type, so docs and errors name it plainly)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            check_relative_path, core_schema.str_schema(strict=True)
        )


class VerifySpec(BaseModel):
    """How a session's result is checked after the agent has finished."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    files: dict[str, str] = Field(default_factory=dict)
    """Hidden files (relative path -> text) written only at grading time, over whatever is there."""
    command: str | None = None
    """Shell command run in the working directory of the grading environment (or set ``python``)."""
    python: str | None = None
    """A Python verifier ``module:function`` instead of ``command``: called as ``await function(check)``
    with a ``raygen.verify.python.PythonCheck`` (the grading environment, the conversation, the spec) after
    the files are staged; returns a reward in [0, 1] or a bool (a plain function works too)."""
    timeout_s: float = Field(60.0, gt=0, le=24 * 3600)
    """Seconds the command may run; past it the check is a ``verify_error``, never a reward of 0."""
    result: ResultKind = "exit_code"
    """``exit_code``: 0 passes (reward 1), anything else fails (reward 0); ``reward_file``: a float in
    [0, 1] read from ``reward_file``; ``last_line``: a float in [0, 1] on the last line of the output."""
    reward_file: str = "reward.txt"
    """File the command writes its reward to (``result: reward_file``); a ``.json`` file holds
    ``{"reward": x}``."""
    retries: int = Field(0, ge=0, le=10)
    """Runs of a check that could not run again at once (a flaky verifier, a grading sandbox that did not
    start), on the same artifacts, before the session fails with ``verify_error`` (which the run's retry
    policy may then run again as a whole session)."""
    pass_threshold: float = Field(1.0, ge=0, le=1)
    """A reward at or above this counts as passed."""
    mode: Mode | None = None
    """``fresh``: a new environment from the row's image receives only ``artifacts``, then ``files``;
    ``same``: the check runs in the agent's environment, ``files`` written over it. Unset: ``fresh``."""
    artifacts: list[RelativePath] = Field(default_factory=list)
    """Files the agent must leave behind: copied to a fresh grading environment and stored with the
    record (for ``raygen rescore``)."""

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("command is empty")
        if v is not None and "\x00" in v:  # no process can be started with it: an error of the row now
            raise ValueError("contains a NUL character, which no command line can hold")
        return v

    @field_validator("python")
    @classmethod
    def _import_path(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[\w.]+:\w+", v):
            raise ValueError(f"{v!r} is not an import path module:function")
        return v

    @field_validator("files")
    @classmethod
    def _file_paths(cls, v: dict[str, str]) -> dict[str, str]:
        return {check_relative_path(path): text for path, text in v.items()}

    @field_validator("reward_file")
    @classmethod
    def _reward_path(cls, v: str) -> str:
        return check_relative_path(v)

    @model_validator(mode="after")
    def _consistent(self) -> VerifySpec:
        if (self.command is None) == (self.python is None):
            raise ValueError("set one of command (a shell command) or python (module:function)")
        # An artifact that is also a hidden file would let the agent's copy stand in for the test.
        clash = sorted(set(self.files) & set(self.artifacts))
        if clash:
            raise ValueError(f"{', '.join(clash)} is both a hidden file and an artifact")
        return self

    @property
    def resolved_mode(self) -> Mode:
        return self.mode or "fresh"
