"""Bounded capture of command output, shared by the environment backends.

A command may print gigabytes; a session keeps only what the model will see. The capture keeps the head
and the tail of a byte stream within a fixed budget, so memory stays bounded whatever the command does.
"""

from __future__ import annotations

from raygen.envs.base import ExecResult
from raygen.formats.text import cap_text


class OutputCapture:
    """Keeps the head and the tail of a byte stream within a fixed budget, never the whole stream."""

    def __init__(self, max_chars: int):
        self.max_chars = max(1, max_chars)
        # cap_text keeps max_chars/2 characters of each side and a UTF-8 character is at most 4 bytes, so
        # 2 * max_chars bytes per side always covers what is kept.
        self.side_budget = 2 * self.max_chars
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.side_budget - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.side_budget:
                del self.tail[: len(self.tail) - self.side_budget]

    def render(self) -> tuple[str, bool]:
        """The text (head + marker + tail if cut) and whether anything was cut."""
        if self.total == len(self.head) + len(self.tail):
            return cap_text(bytes(self.head + self.tail).decode("utf-8", "replace"), self.max_chars)
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        marker = f"\n... [output cut by raygen: {self.total} bytes in all] ...\n"
        keep = max(0, self.max_chars - len(marker))
        return head[: keep // 2] + marker + (tail[-(keep - keep // 2) :] if keep else ""), True


def exec_result(
    exit_code: int, out: OutputCapture, err: OutputCapture, timed_out: bool, duration_s: float
) -> ExecResult:
    """The ExecResult of a finished command from its two captured streams."""
    stdout, stdout_cut = out.render()
    stderr, stderr_cut = err.render()
    return ExecResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        truncated=stdout_cut or stderr_cut,
        duration_s=duration_s,
    )
