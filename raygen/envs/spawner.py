"""The command spawner of the local backend: one long-lived process per session actor that starts each
command under its own keeper. Run as ``python -I -S spawner.py SOCKET_FD``; it imports nothing of
raygen (``raygen.envs.spawner_client`` starts it and talks to it).

Same guarantee as ``subreaper.py``, without starting an interpreter for every command: per request
(one SOCK_SEQPACKET message: JSON ``{"argv", "env", "cwd"}`` with four descriptors: stdin, stdout,
stderr and a status pipe) it forks a *keeper*, which starts a new session (its pid is the process group
of the command), makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) and forks the command. A
process that detaches in any way (``setsid``, ``nohup``, a double fork) is re-parented to the keeper, so
it stays findable as a descendant of the command's group until the session kills it.

The status pipe carries two lines: the keeper's pid as soon as it exists, and the command's wait status
when the command ends (background jobs do not hold the call), after "d" if nothing else of it is left
(the keeper is ending) or "b" if background jobs remain. The keeper then waits for every
descendant and exits; this process reaps it at once (SIGCHLD), so an ended group never looks alive.
EOF after the first line means the keeper was killed before the command ended.
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
MAX_REQUEST_BYTES = 1 << 20
"""The client sends at most this much (a command line is at most 128 KiB anyway)."""
_LIBC = ctypes.CDLL(None, use_errno=True)


def _keeper(request: dict, stdin: int, stdout: int, stderr: int, status: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its children itself
    os.setsid()
    if _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        os.write(stderr, b"raygen spawner: prctl(PR_SET_CHILD_SUBREAPER) failed\n")
    os.write(status, b"%d\n" % os.getpid())
    try:
        os.chdir(request["cwd"])
        # posix_spawn (vfork in glibc): no copy of this process's pages for a child that only execs.
        command = os.posix_spawnp(
            request["argv"][0],
            request["argv"],
            request["env"],
            # Descriptors received over the socket are inheritable: the command gets them as 0-2 only
            # (a background job holding the status pipe would hold the client's call).
            file_actions=[
                (os.POSIX_SPAWN_DUP2, stdin, 0),
                (os.POSIX_SPAWN_DUP2, stdout, 1),
                (os.POSIX_SPAWN_DUP2, stderr, 2),
                *((os.POSIX_SPAWN_CLOSE, fd) for fd in (stdin, stdout, stderr, status) if fd > 2),
            ],
            # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, and
            # `yes | head` must end as it does in a shell.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    except OSError as exc:
        os.write(stderr, f"raygen spawner: cannot run {request['argv'][0]}: {exc}\n".encode())
        os.write(status, b"d%d\n" % (127 << 8))
        os._exit(0)
    # Hold none of the command's pipes: the worker stops reading once only background jobs hold them.
    for fd in (stdin, stdout, stderr):
        os.close(fd)
    subreaper.keep(command, status, b"\n")


def serve(sock: socket.socket) -> None:
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
        try:
            keeper = os.fork()
        except OSError as exc:  # no process left for this user: the status pipe closes with nothing
            os.write(2, f"raygen spawner: fork: {exc}\n".encode())
            keeper = -1
        if keeper == 0:
            try:
                sock.close()
                _keeper(request, *fds)
            finally:
                os._exit(127)
        for fd in fds:
            os.close(fd)
        subreaper.others_running()  # reaps the keepers that ended


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
