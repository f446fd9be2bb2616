"""The shell side of an exec channel (``docker_channel``), apart from its transport: the prelude a
channel's ``sh`` runs first, quoting, and the parsing of replies (see ``docker_channel`` for the protocol).
Only POSIX ``sh`` and ``head``/``tail``/``wc``/``cat`` inside the container (busybox has them all)."""

from __future__ import annotations

import errno
import logging
import re
from dataclasses import dataclass

from raygen.envs.capture import OutputCapture
from raygen.envs.processes import MAX_READ_BYTES

log = logging.getLogger(__name__)

CHANNEL_DIR = "/tmp/.raygen-channel"
HEADER = re.compile(rb"@RG (\w+) (-?\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)\n")
# errno-style codes of the file requests (the channel's own, taken from the shell's tests)
_CODES: dict[int, tuple[type[OSError], int, str]] = {
    2: (FileNotFoundError, errno.ENOENT, "No such file or directory"),
    13: (PermissionError, errno.EACCES, "Permission denied"),
    20: (NotADirectoryError, errno.ENOTDIR, "cannot create the parent directory"),
    21: (IsADirectoryError, errno.EISDIR, "Is a directory"),
    22: (OSError, errno.EINVAL, "not a regular file"),
    27: (OSError, errno.EFBIG, f"file larger than {MAX_READ_BYTES} bytes"),
}

# Sent once when the channel opens; every request calls rg_reply. What travels is first copied to
# snapshot files of the request's own (a background child of a command may still write to its output
# file, a file being read may change): the header's lengths are those of the snapshots, so the stream
# never loses its framing. The lock is a noclobber create with ``true``, a builtin (no fork; a regular
# one, whose failed redirection does not end the shell); the header is printf (a builtin), the bytes
# one cat.
PRELUDE = rf"""
umask 022
D={CHANNEL_DIR}.$$
mkdir -p "$D" || exit 97
rg_snap() {{
  head -c $(($2 * 2)) -- "$1" > "$3.h" 2>/dev/null; : > "$3.t"
  rg_h=$(($(wc -c < "$3.h"))); rg_t=0; rg_total=$rg_h
  if [ $rg_h -ge $(($2 * 2)) ]; then
    rg_total=$(($(wc -c < "$1")))
    if [ $rg_total -gt $rg_h ]; then
      head -c "$2" -- "$1" > "$3.h"; tail -c "$2" -- "$1" > "$3.t"
      rg_h=$(($(wc -c < "$3.h"))); rg_t=$(($(wc -c < "$3.t")))
    fi
  fi
}}
rg_reply() {{
  rg_snap "$4" "$3" "$D/$1.1"; h1=$rg_h; t1=$rg_t; n1=$rg_total
  rg_snap "$5" "$3" "$D/$1.2"; h2=$rg_h; t2=$rg_t; n2=$rg_total
  set -C; until true 2>/dev/null > "$D/lock"; do sleep 0.005 2>/dev/null || sleep 1; done; set +C
  printf '@RG %s %s %s %s %s %s %s %s\n' "$1" "$2" $h1 $t1 $n1 $h2 $t2 $n2
  cat "$D/$1.1.h" "$D/$1.1.t" "$D/$1.2.h" "$D/$1.2.t"
  rm -f "$D/lock" "$D/$1.1.h" "$D/$1.1.t" "$D/$1.2.h" "$D/$1.2.t"
}}
rg_size() {{ wc -c < "$1"; }}
"""


def quote(text: str) -> str:
    """A single-quoted shell word (NUL cannot be passed to a process at all)."""
    if "\0" in text:
        raise ValueError("a NUL byte cannot be passed to a command")
    return "'" + text.replace("'", "'\"'\"'") + "'"


@dataclass
class Part:
    """One file of a reply: its head, its tail (empty unless cut) and its whole size."""

    head: bytes
    tail: bytes
    total: int

    def into(self, capture: OutputCapture) -> OutputCapture:
        capture.feed(self.head)
        capture.feed(self.tail)
        capture.total = self.total
        return capture


@dataclass
class Reply:
    code: int
    parts: tuple[Part, Part]


class ReplyBuffer:
    """The channel's stdout, reassembled from frames, cut into replies."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, payload: bytes) -> None:
        self.data += payload

    def take_reply(self) -> tuple[str, Reply] | None:
        end = self.data.find(b"\n")
        if end < 0:
            return None
        match = HEADER.fullmatch(bytes(self.data[: end + 1]))
        if match is None:  # not ours (nothing else writes to this stream): skip the line
            log.warning("exec channel: unexpected output %r", bytes(self.data[:200]))
            del self.data[: end + 1]
            return self.take_reply()
        tag, code, *numbers = match.groups()
        head1, tail1, total1, head2, tail2, total2 = (int(number) for number in numbers)
        if len(self.data) < end + 1 + head1 + tail1 + head2 + tail2:
            return None
        at = end + 1
        chunks = []
        for length in (head1, tail1, head2, tail2):
            chunks.append(bytes(self.data[at : at + length]))
            at += length
        del self.data[:at]
        parts = (Part(chunks[0], chunks[1], total1), Part(chunks[2], chunks[3], total2))
        return tag.decode(), Reply(int(code), parts)


def octal(chunk: bytes) -> str:
    return "".join(f"\\{byte:03o}" for byte in chunk)


def raise_for(reply: Reply, shown_path: str) -> None:
    if reply.code == 0:
        return
    kind, code, message = _CODES.get(reply.code, (OSError, errno.EIO, f"channel code {reply.code}"))
    raise kind(code, message, shown_path)
