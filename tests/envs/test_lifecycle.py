"""The lifecycle every backend inherits from ``Environment``: start once, close once, background tasks."""

from __future__ import annotations

import asyncio

import pytest

from raygen.envs.base import Environment, EnvSpec, ExecResult
from raygen.errors import SessionFailure


class Recorder(Environment):
    """Creation takes ``create_s``; the teardown records what it found."""

    def __init__(self, create_s: float = 0.0):
        super().__init__(EnvSpec(session_key="k"))
        self.create_s = create_s
        self.creations = 0
        self.teardowns: list[str] = []

    async def start(self) -> None:
        self._refuse_if_closed()
        await self._start_once(self._create())

    async def _create(self) -> str:
        self.creations += 1
        await asyncio.sleep(self.create_s)
        return "made"

    async def _teardown(self) -> None:
        self._cancel_background()
        outcome = await self._start_outcome()
        self.teardowns.append("nothing" if outcome is None else outcome.result())

    async def exec(self, command: str, timeout_s: float, max_output_chars: int) -> ExecResult:
        return ExecResult(0, "", "")

    async def read_file(self, path: str) -> bytes:
        return b""

    async def write_file(self, path: str, data: bytes) -> None:
        return None


async def test_a_start_cancelled_mid_creation_is_torn_down_once_the_creation_ends():
    env = Recorder(create_s=0.2)
    starting = asyncio.ensure_future(env.start())
    await asyncio.sleep(0.05)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await asyncio.gather(env.close(), env.close())
    assert env.creations == 1
    assert env.teardowns == ["made"]  # waited for the creation, then tore it down, once


async def test_close_without_start_tears_down_nothing_and_start_after_close_is_refused():
    env = Recorder()
    await env.close()
    assert env.closed and env.teardowns == ["nothing"]
    with pytest.raises(SessionFailure) as failure:
        await env.start()
    assert failure.value.kind == "env_start"


async def test_a_second_start_reuses_the_first_creation():
    env = Recorder()
    await asyncio.gather(env.start(), env.start())
    assert env.creations == 1 and env._started


async def test_a_cancelled_close_still_finishes_the_teardown():
    env = Recorder(create_s=0.1)
    starting = asyncio.ensure_future(env.start())
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(env.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert env.teardowns == ["made"]
    await starting


async def test_background_work_is_kept_until_done_and_dropped_once_closing():
    env = Recorder()
    ran: list[str] = []

    async def work(name: str) -> None:
        await asyncio.sleep(0.01)
        ran.append(name)

    env._spawn(work("before"))
    assert len(env._background) == 1
    await asyncio.sleep(0.05)
    assert ran == ["before"] and not env._background
    env._spawn(work("long"))
    await env.close()  # cancels what still runs
    env._spawn(work("after"))  # closed: not started at all
    await asyncio.sleep(0.05)
    assert ran == ["before"]
