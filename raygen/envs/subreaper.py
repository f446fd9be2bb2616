"""Run one command so that nothing it starts can leave the session: ``python -I -S subreaper.py ARGV...``.

The local backend starts each command through this script (a file run by path, importing nothing of
raygen, so it starts in milliseconds). It forks a *keeper* that makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``, no privileges needed) and forks the command. A process that detaches in
any way (``setsid``, ``nohup``, a double fork, ``cd /``) is re-parented to the keeper instead of init, so
it stays a descendant of the keeper, which stays in the command's process group until every descendant
is gone. ``LocalEnvironment`` kills the whole tree under that group on timeout and at close
(``raygen.envs.processes.kill_process_trees``).

This front process waits only for the command itself and exits as it did: background jobs do not hold
the call, exactly as without the script. ``subreaper.pl`` is its Perl twin (same steps, a sixth of the
start-up CPU), used where perl exists (``raygen.envs.local.subreaper_prefix``); the tests run both.
"""

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def _keeper(argv: list[str], status_fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(2, b"raygen subreaper: prctl(PR_SET_CHILD_SUBREAPER) failed\n")
    command = os.fork()
    if command == 0:
        os.close(status_fd)
        # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, and
        # `yes | head` must end as it does in a shell.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    # Hold none of the command's pipes: the worker stops reading once only background jobs hold them.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep(command, status_fd)


def keep(command: int, status_fd: int, end: bytes = b"") -> None:
    """The keeper's watch (``spawner.py``'s keepers share it): reap every descendant, the re-parented
    ones too, until none is left, then exit. When ``command`` ends, write to ``status_fd`` "d" if nothing
    else is left (this keeper ends at once: the front reaps it, the spawner's client forgets its group)
    or "b" if background jobs remain (it waits for them), then the wait status and ``end``."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break  # nothing left: every descendant has ended
        except InterruptedError:
            continue
        if pid == command:
            os.write(status_fd, (b"b" if others_running() else b"d") + str(wait_status).encode() + end)
            os.close(status_fd)
    os._exit(0)


def others_running() -> bool:
    """Whether this process still has children (those that already ended are reaped here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        except InterruptedError:
            continue
        if pid == 0:
            return True


def main(argv: list[str]) -> None:
    read_fd, write_fd = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        os.close(read_fd)
        _keeper(argv, write_fd)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 64):
        data += chunk
    if data.startswith(b"d"):
        # A keeper with nothing left ends right after its message: reaped here. Left to init it would be
        # a zombie for as long as init takes to reap (seconds, on some machines), and its process group
        # would look alive to the worker (kill 0 succeeds on a zombie): every session's cleanup would take
        # the slow path. A keeper waiting for background jobs is left alone.
        os.waitpid(keeper, 0)
    data = data.lstrip(b"db")
    if not data:  # the keeper was killed before the command ended
        sys.exit(128 + signal.SIGKILL)
    status = int(data)
    if os.WIFSIGNALED(status):  # end the way the command ended, so the caller sees the signal
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two whose handler cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1:])
