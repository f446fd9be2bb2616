"""What the Singularity/Apptainer backend runs besides its commands: a long-lived process in a session's
instance with its stdin attached (``SingularityEnvironment.open_process``: an MCP stdio server), and how a
command's end becomes its ``ExecResult``.

The process is ``apptainer exec instance://NAME ARGV`` on the host, its stdin and stdout piped; inside the
instance it carries ``RAYGEN_EXEC_ID`` like every command of the backend, so closing it kills it and
whatever it started there (the kill-by-tag script), besides the host-side process group; stopping the
instance at the session's end ends the rest.
"""

from __future__ import annotations

import posixpath
import secrets
from typing import Any

from raygen.envs.base import ExecResult
from raygen.envs.capture import OutputCapture, exec_result
from raygen.envs.processes import EXEC_ID_VAR, TIMEOUT_EXIT_CODE
from raygen.envs.stdio_process import HostProcess


async def open_instance_process(
    env: Any, argv: list[str], variables: dict[str, str], cwd: str | None
) -> HostProcess:
    """Start ``argv`` in ``env``'s instance (a started ``SingularityEnvironment``)."""
    env._require_running()
    exec_id = secrets.token_hex(8)
    where = env.cwd if cwd is None else posixpath.normpath(posixpath.join(env.cwd, cwd))
    host_env = {
        **env._process_env,
        **env._container_vars,
        **{f"APPTAINERENV_{name}": value for name, value in variables.items()},
        f"APPTAINERENV_{EXEC_ID_VAR}": exec_id,
    }
    return await HostProcess.start(
        env._exec_argv(where, *argv),
        env=host_env,
        cwd=None,
        groups=env._process_groups,
        on_close=lambda: env._spawn(env._kill_in_instance(exec_id)),
    )


def exec_outcome(
    returncode: int | None, out: OutputCapture, err: OutputCapture, timed_out: bool, duration: float
) -> ExecResult:
    """A finished ``apptainer exec`` as the command's result (a timeout as 124, a signal like bash)."""
    if timed_out or returncode is None:
        exit_code = TIMEOUT_EXIT_CODE
    else:
        exit_code = 128 - returncode if returncode < 0 else returncode
    return exec_result(exit_code, out, err, timed_out, duration)
