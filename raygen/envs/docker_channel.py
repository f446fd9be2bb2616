"""A long-lived exec channel into a Docker container: one ``sh`` per container reading commands from its
attached stdin, instead of one ``docker exec`` per tool call.

Why: a ``docker exec`` is an exec create, a start with an HTTP upgrade and an inspect, each a round trip
through dockerd and containerd, which are CPU-bound on a small machine (measured on 2 cores with 16
containers at once: 0.6 s per exec, against a few ms through the channel). The channel is the
container's own process: ``sh`` with its stdin attached before the container starts (the image's own
user and environment, as every ``docker exec`` had; the container's log driver is ``none``, so what
travels is not also written to disk); commands then cost only the forks inside the container.

Protocol. The host writes shell code to the channel's stdin; the channel's ``sh`` runs each request as a
background subshell, so tool calls of one session run at once and a kill never waits behind a command.

- ``exec``: ``VAR='v' ... RAYGEN_EXEC_ID='<tag>' sh -c '<command>'`` in the cwd (created if a command
  deleted it), stdin ``/dev/null``, stdout and stderr to two files of the channel's folder; when ``sh``
  ends (its background children do not hold anything open), the subshell replies.
- a reply, written under a lock (``set -C``: only one reply at a time on the stream), is the line
  ``@RG <tag> <code> <head1> <tail1> <total1> <head2> <tail2> <total2>`` then the bytes: per file, all
  of it if it holds at most ``2*side``, else its first and last ``side`` bytes. Output is capped inside
  the container, only what the model can see travels (the files stay on the container's disk until the
  reply, like any file a command writes).
- a kill runs the kill-by-exec-id script (``processes.KILL_BY_EXEC_ID_SCRIPT``) in the background, the
  same one ``docker exec`` used; the killed command's reply follows. If the command outlived it (it
  switched to a user the channel cannot signal), the backend's root ``docker exec`` kill runs too.
- files: ``read_file`` replies with the file itself as the first stream (``cat``, symlinks followed);
  ``write_file`` sends the bytes as ``printf`` octal escapes (binary-safe, 4 bytes of script per byte,
  so files above ``MAX_CHANNEL_WRITE`` take the archive API instead).

The host side is ``exec_channel.ExecChannel`` (shared with the Apptainer backend); the shell side
``shell_channel``. The channel's stream is Docker's multiplexed stream (8-byte frame headers); a reader
task on the event loop parses it, so an open channel holds no thread. When the channel ends (EOF, a
command killed its shell, which ends the container as killing the keep-alive did), requests in flight
fail with ``env_lost``; so do later calls, through ``docker exec``, once the container is gone.
"""

from __future__ import annotations

import asyncio
import os
import socket
from contextlib import suppress
from typing import Any

from raygen.envs.exec_channel import ExecChannel, open_over

CHANNEL_COMMAND = ["sh"]
"""The container's own process when the channel is on: ``sh`` reading the host's requests from its stdin
(kept open by the engine while nobody is attached, so it also keeps the container alive, as the
keep-alive ``sleep`` does without the channel)."""


def attach_stdin(api: Any, container_id: str) -> socket.socket | None:
    """Blocking, between create and start: attach to the container's stdin, stdout and stderr; a
    non-blocking socket of our own (a dup, so closing docker-py's response does not close it), or None on
    a transport we cannot take over (TLS, ssh: commands then take ``docker exec``)."""
    params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
    raw = api.attach_socket(container_id, params=params)
    inner = getattr(raw, "_sock", raw)
    try:
        if not isinstance(inner, socket.socket) or type(inner) is not socket.socket:
            return None  # TLS (an SSLSocket) or ssh (a paramiko channel)
        ours = socket.socket(fileno=os.dup(inner.fileno()))
    finally:
        with suppress(Exception):
            raw.close()
        with suppress(Exception):
            raw._response.close()
    ours.setblocking(False)
    return ours


async def channel_over(sock: socket.socket, name: str) -> ExecChannel:
    """The channel on an attached socket: the prelude sent, ready for requests."""
    reader, writer = await asyncio.open_connection(sock=sock)
    return await open_over(reader, writer, name, framed=True)
