"""A harness run as a shell command in the session's environment, its model calls through the proxy.

Per session: a seat folder beside the proxy's socket (a hard link to the socket, the forwarder, the prompt
and ``agent.json``) bound into the sandbox; the command ``python3 forward.py SEAT`` runs in the session's
working directory with the run's ``session_timeout_s`` as its timeout. A refused call (past
``max_turns``) or a failed one (the provider's final error) gives the harness ``STOP_GRACE_S`` to report
and exit, then its process group is killed. The outcome is judged in ``judge`` below.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from raygen.agents.base import Harness, HarnessRun, Seat
from raygen.agents.configs import HarnessConfig
from raygen.agents.presets import harness_command, harness_env
from raygen.agents.proxy import ModelProxy, ProxySeat
from raygen.envs.base import Environment, ExecResult
from raygen.errors import SessionFailure
from raygen.formats.records import AgentInfo
from raygen.formats.text import cap_text
from raygen.model.base import ChatModel

FORWARDER = Path(__file__).with_name("forward.py")
STOP_GRACE_S = 5.0
"""After a refused or failed model call, how long the harness may take to report it and exit."""
NOT_FOUND_EXIT = 127
"""The shell's exit code for a command it cannot find."""


class CommandHarness(Harness):
    """Any harness given as a command (``agent.type: command``) or a preset (``hermes``, ...)."""

    def __init__(self, config: HarnessConfig):
        self.config = config
        self.command = harness_command(config)
        self.env = harness_env(config)
        self._proxy: ModelProxy | None = None
        self._starting: asyncio.Lock | None = None
        self._starting_loop: asyncio.AbstractEventLoop | None = None

    async def proxy(self) -> ModelProxy:
        """This process's proxy, started on first use on the running loop (a new loop gets a new one)."""
        loop = asyncio.get_running_loop()
        if self._proxy is None or self._proxy.loop is not loop:
            if self._starting is None or self._starting_loop is not loop:
                self._starting, self._starting_loop = asyncio.Lock(), loop
            async with self._starting:
                if self._proxy is None or self._proxy.loop is not loop:
                    if self._proxy is not None:  # its loop is gone (tests): only its folder is left
                        shutil.rmtree(self._proxy.directory, ignore_errors=True)
                    proxy = ModelProxy()
                    await proxy.start()
                    self._proxy = proxy
        return self._proxy

    @contextlib.asynccontextmanager
    async def seat(
        self, *, model: ChatModel, max_calls: int, prompt: str, session_id: str
    ) -> AsyncIterator[CommandSeat]:
        proxy = await self.proxy()
        seat = proxy.open_seat(model, max_calls)
        folder = Path(tempfile.mkdtemp(prefix="seat-", dir=proxy.directory))
        try:
            _lay_out(folder, proxy, seat, self, prompt, session_id, model.name)
            yield CommandSeat(self, proxy, seat, folder)
        finally:
            proxy.close_seat(seat)
            shutil.rmtree(folder, ignore_errors=True)

    async def aclose(self) -> None:
        if self._proxy is not None:
            await self._proxy.close()
            self._proxy = None


def _lay_out(
    folder: Path,
    proxy: ModelProxy,
    seat: ProxySeat,
    harness: CommandHarness,
    prompt: str,
    session_id: str,
    model: str,
) -> None:
    """The seat folder: what the forwarder inside the sandbox reads (no secret: the token is the seat's)."""
    os.link(proxy.socket_path, folder / "proxy.sock")
    shutil.copyfile(FORWARDER, folder / "forward.py")
    (folder / "prompt.txt").write_text(prompt, encoding="utf-8")
    agent = {"command": harness.command, "token": seat.token, "model": model, "session_id": session_id}
    agent["env"] = harness.env
    (folder / "agent.json").write_text(json.dumps(agent), encoding="utf-8")


class CommandSeat(Seat):
    def __init__(self, harness: CommandHarness, proxy: ModelProxy, seat: ProxySeat, folder: Path):
        self.harness, self.proxy, self.seat, self.folder = harness, proxy, seat, folder
        self.binds = [str(folder)]
        self.env: dict[str, str] = {}

    async def run(self, env: Environment, timeout_s: float) -> HarnessRun:
        config = self.harness.config
        argv = [config.python, str(self.folder / "forward.py"), str(self.folder)]
        tail = config.output_tail_chars
        started = time.monotonic()
        running = asyncio.ensure_future(env.exec(shlex.join(argv), max(timeout_s, 1.0), max(4 * tail, 4000)))
        stopping = asyncio.ensure_future(self.seat.stop.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not running.done():  # a refused or failed call: a moment to report it, then stopped
                await asyncio.wait({running}, timeout=STOP_GRACE_S)
            result = running.result() if running.done() else None
        finally:
            stopping.cancel()
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        self.proxy.close_seat(self.seat)
        info = AgentInfo(
            type=config.type,
            command=self.harness.command,
            exit_code=None if result is None or result.timed_out else result.exit_code,
            stdout_tail=_tail(result.stdout if result else "", tail),
            stderr_tail=_tail(result.stderr if result else "", tail),
            duration_s=round(time.monotonic() - started, 4),
            refused=self.seat.refused,
        )
        return judge(self.seat, result, info)


def _tail(text: str, chars: int) -> str:
    return text[-chars:] if chars else ""


def judge(seat: ProxySeat, result: ExecResult | None, info: AgentInfo) -> HarnessRun:
    """What the session's end means: the first that applies of a provider failure of a call, the call
    limit, a timeout, calls after the end, a command not found, no call at all, a non-zero exit without a
    final answer (an answer without tool calls); else completed."""
    run = HarnessRun(calls=seat.calls, info=info, late_calls=seat.late_calls)
    answered = [c for c in seat.calls if c.response is not None]
    final = bool(answered) and not answered[-1].response.get("tool_calls")
    stderr, _ = cap_text(info.stderr_tail.strip(), 500)
    if seat.failure is not None:
        run.failure = seat.failure
    elif seat.refused:
        run.exit_status = seat.refused
    elif result is not None and result.timed_out:
        run.failure = SessionFailure(
            "session_timeout", f"the agent ran past session.session_timeout_s ({info.duration_s:.0f} s)"
        )
    elif seat.late_calls:
        run.failure = SessionFailure(
            "agent_late_call", f"{seat.late_calls} model call(s) after the agent's session ended"
        )
    elif result is None:
        run.failure = SessionFailure("internal", "the agent stopped without a refused or failed call")
    elif result.exit_code == NOT_FOUND_EXIT and not seat.calls:
        run.failure = SessionFailure("agent_not_found", f"exit {NOT_FOUND_EXIT}: {stderr}")
    elif not seat.calls:
        run.failure = SessionFailure(
            "agent_no_model_call", f"exit {result.exit_code} without a model call: {stderr}"
        )
    elif result.exit_code != 0 and not final:
        run.failure = SessionFailure("agent_failed", f"exit {result.exit_code}: {stderr}")
    return run
