"""The command spawner of the local backend: one long-lived process per session actor that starts each
command under its own keeper. Run as ``python -I -S spawner.py SOCKET_FD``; it imports nothing of
raygen (``raygen.envs.spawner_client`` starts it and talks to it).

Same guarantee as ``subreaper.py``, without starting an interpreter for every command: per request
(one SOCK_SEQPACKET message: JSON ``{"argv", "env", "cwd"}`` with four descriptors: stdin, stdout,
stderr and a status pipe) it forks a *keeper*, which starts a new session (its pid is the process group
of the command), makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) and starts the command
with ``posix_spawn``. A
process that detaches in any way (``setsid``, ``nohup``, a double fork) is re-parented to the keeper, so
it stays findable as a descendant of the command's group until the session kills it.

The status pipe carries two lines: the keeper's pid as soon as it exists, and the command's wait status
when the command ends (background jobs do not hold the call), after "d" if nothing else of it is left
(the keeper is ending) or "b" if background jobs remain. The keeper then waits for every
descendant and exits; this process reaps it at once (SIGCHLD), so an ended group never looks alive.
EOF after the first line means the keeper was killed before the command ended (it ignores the usual
signals a command sends its own group; SIGKILL cannot be ignored). EOF before it: nothing started.
"""

import ctypes
import gc
import json
import os
import signal
import socket
import sys

# -I leaves the script's folder out of sys.path; subreaper.py (run by path too) has the keeper's watch.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import subreaper

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
MAX_REQUEST_BYTES = 1 << 20
"""The client sends at most this much (a command line is at most 128 KiB anyway)."""
_LIBC = ctypes.CDLL(None, use_errno=True)
KEEPER_IGNORES = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""Signals the keepers ignore (set once here, inherited by every fork), so that a command signalling its
own group (``trap 'kill 0' EXIT``) ends itself, not the keeper that reports its status; the command
starts with their defaults. The session's own kills are SIGSTOP and SIGKILL."""
_NULL = -1
"""/dev/null, opened once: each keeper's stderr (not the session actor's log, which this process keeps)."""
_found: dict[tuple[str, str], str] = {}


def _set_name(name: bytes) -> None:
    # Not "python": a model's `pkill python` must not take the keepers of every session of the actor.
    _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _search(program: str, path: str) -> str | None:
    """``program`` looked up in the command's PATH, as ``execvp`` does in the command's environment
    (``posix_spawnp`` would search this process's PATH, and this process has no environment)."""
    if "/" in program:
        return program
    for folder in path.split(":"):
        candidate = os.path.join(folder or ".", program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _search_remembered(program: str, path: str) -> str | None:
    """``_search`` before the fork, remembered and checked again each time (one ``access`` call instead
    of one per PATH entry); None when PATH has a relative entry, which depends on the command's cwd (the
    keeper searches then, after its chdir)."""
    key = (program, path)
    known = _found.get(key)
    if known is not None and os.access(known, os.X_OK):
        return known
    if not all(folder.startswith("/") for folder in path.split(":")):
        return None
    found = _search(program, path)
    if found is not None:
        _found[key] = found
    return found


def _keeper(request: dict, program: str | None, stdin: int, stdout: int, stderr: int, status: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its children itself
    _set_name(b"raygen-keeper")
    os.setsid()
    if _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(stderr, b"raygen spawner: prctl(PR_SET_CHILD_SUBREAPER) failed\n")
    os.write(status, b"%d\n" % os.getpid())
    os.dup2(_NULL, 2)  # hold none of the session actor's descriptors either (its log)
    argv, env = request["argv"], request["env"]
    try:
        os.chdir(request["cwd"])
        program = program or _search(argv[0], env.get("PATH", os.defpath))
        if program is None:
            raise FileNotFoundError(2, "command not found", argv[0])
        # posix_spawn (vfork in glibc): no copy of this process's pages for a child that only execs.
        command = os.posix_spawn(
            program,
            argv,
            env,
            # Descriptors received over the socket are inheritable: the command gets them as 0-2 only
            # (a background job holding the status pipe would hold the client's call).
            file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin, 0),
                (os.POSIX_SPAWN_DUP2, stdout, 1),
                (os.POSIX_SPAWN_DUP2, stderr, 2),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in (stdin, stdout, stderr, status) if fd > 2),
            ],
            # Python ignores SIGPIPE and SIGXFSZ, this keeper KEEPER_IGNORES; an ignored signal stays
            # ignored across exec, and `yes | head` must end as it does in a shell.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *KEEPER_IGNORES),
        )
    except (OSError, ValueError) as exc:
        os.write(stderr, f"raygen spawner: cannot run {argv[0]}: {exc}\n".encode())
        os.write(status, b"d%d\n" % (127 << 8))
        os._exit(0)
    # Hold none of the command's pipes: the worker stops reading once only background jobs hold them.
    for fd in (stdin, stdout, stderr):
        os.close(fd)
    subreaper.keep(command, status, b"\n")


def serve(sock: socket.socket) -> None:
    global _NULL
    _set_name(b"raygen-spawner")
    _NULL = os.open(os.devnull, os.O_RDWR)
    for sig in KEEPER_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    gc.disable()  # nothing here makes cycles; a collection would only dirty pages that every fork copies
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: subreaper.others_running())  # reaps keepers
    while True:
        try:
            message, fds, _flags, _address = socket.recv_fds(sock, MAX_REQUEST_BYTES, 4)
        except ConnectionResetError:
            return
        if not message:
            return  # the session actor is gone
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        request = json.loads(message)
        program = _search_remembered(request["argv"][0], request["env"].get("PATH", os.defpath))
        try:
            keeper = os.fork()
        except OSError as exc:  # no process left for this user: the status pipe closes with nothing
            os.write(2, f"raygen spawner: fork: {exc}\n".encode())
            keeper = -1
        if keeper == 0:
            try:
                sock.close()
                _keeper(request, program, *fds)
            finally:
                os._exit(127)
        for fd in fds:
            os.close(fd)
        subreaper.others_running()  # reaps the keepers that ended


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
