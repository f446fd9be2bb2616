"""Nothing a session starts outlives it on the local backend, however it detaches (issue 15, case 2).

Real detached daemons: ``setsid nohup`` from ``/``, a double fork with a wiped environment, a daemon left
by a command that times out or is cancelled. The subreaper (raygen/envs/subreaper.py) keeps each one a
descendant of its command's keeper, and close() / the timeout kill that whole tree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from raygen.config import LocalEnvConfig
from raygen.envs import local
from raygen.envs.base import EnvSpec
from raygen.envs.local import LocalEnvironment
from tests.envs.conformance import alive_host_pids


@pytest.fixture(autouse=True, params=["spawner", "perl", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with each way of keeping a command's descendants: the actor's spawner (spawner.py, the
    default) and, where it cannot take a command, each twin of the subreaper script (subreaper.pl where
    perl exists, else subreaper.py)."""
    if request.param == "spawner":
        return request.param
    monkeypatch.setattr(local, "USE_SPAWNER", False)
    if request.param == "perl":
        prefix = local.subreaper_prefix()
        if "perl" not in prefix[0]:
            pytest.skip("no perl here, or an architecture without a known prctl number")
    else:
        prefix = (sys.executable, "-I", "-S", local.SUBREAPER)
    monkeypatch.setattr(local, "subreaper_prefix", lambda: prefix)
    return request.param


def make_env(root: Path) -> LocalEnvironment:
    return LocalEnvironment(LocalEnvConfig(root=root / "sessions"), EnvSpec(session_key="detach"))


def pids_running(argument: str) -> list[int]:
    """Live host pids whose command line holds ``argument`` (a unique sleep duration)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue
        if argument.encode() in words and alive_host_pids([int(entry)]):
            found.append(int(entry))
    return found


def unique_sleep() -> str:
    return f"1002.{uuid.uuid4().int % 10**9}"  # a duration no other process on the host runs


async def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


async def test_the_daemon_of_the_issue_dies_with_the_session(tmp_path: Path):
    duration = unique_sleep()
    env = make_env(tmp_path)
    async with env:
        result = await env.exec(f"cd / && setsid nohup sleep {duration} > /dev/null 2>&1 &", 10, 1000)
        assert result.exit_code == 0
        assert await wait_for(lambda: pids_running(duration))  # detached: new session, cwd "/"
        [pid] = pids_running(duration)
        assert os.getsid(pid) == pid and os.readlink(f"/proc/{pid}/cwd") == "/"
    assert pids_running(duration) == []


async def test_a_double_forked_daemon_with_a_wiped_environment_dies_with_the_session(tmp_path: Path):
    duration = unique_sleep()
    env = make_env(tmp_path)
    async with env:
        # The subshell exits at once, so the daemon's parent is gone before the command ends.
        command = f"(cd / && exec env -i setsid sleep {duration} < /dev/null > /dev/null 2>&1 &); echo ok"
        assert (await env.exec(command, 10, 1000)).stdout == "ok\n"
        assert await wait_for(lambda: pids_running(duration))
        assert (await env.exec("echo next", 10, 1000)).stdout == "next\n"  # a later command: still alive
        assert pids_running(duration)
    assert pids_running(duration) == []


async def test_a_timed_out_command_takes_its_daemons_with_it(tmp_path: Path):
    duration = unique_sleep()
    env = make_env(tmp_path)
    async with env:
        command = f"cd / && setsid sleep {duration} > /dev/null 2>&1 & sleep 60"
        result = await env.exec(command, 1, 1000)
        assert result.timed_out and result.exit_code == 124
        assert await wait_for(lambda: pids_running(duration) == [])  # before close, at the timeout


async def test_a_cancelled_command_takes_its_daemons_with_it(tmp_path: Path):
    duration = unique_sleep()
    env = make_env(tmp_path)
    async with env:
        task = asyncio.create_task(
            env.exec(f"cd / && setsid sleep {duration} > /dev/null 2>&1 & sleep 60", 30, 100)
        )
        assert await wait_for(lambda: pids_running(duration))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_for(lambda: pids_running(duration) == [])


async def test_commands_keep_their_exit_codes_and_pipes_under_the_subreaper(tmp_path: Path):
    async with make_env(tmp_path) as env:
        assert (await env.exec("exit 7", 10, 100)).exit_code == 7
        assert (await env.exec("kill -TERM $$", 10, 100)).exit_code == 143
        # SIGPIPE is the default again for the command (Python ignores it): `yes` ends quietly.
        piped = await env.exec("yes | head -c 4; s=${PIPESTATUS[0]}; echo; echo $s", 10, 100)
        assert piped.stdout == "y\ny\n\n141\n" and piped.stderr == ""
        assert (await env.exec("echo $PPID > /dev/null; echo out; echo err >&2", 10, 100)).stdout == "out\n"


async def test_without_the_subreaper_a_double_forked_daemon_escapes(tmp_path: Path):
    # The documented cost of env.subreaper: false (no Python start per command): this daemon gets away.
    duration = unique_sleep()
    config = LocalEnvConfig(root=tmp_path / "sessions", subreaper=False)
    async with LocalEnvironment(config, EnvSpec(session_key="plain")) as env:
        command = f"(cd / && exec env -i setsid sleep {duration} < /dev/null > /dev/null 2>&1 &); echo ok"
        assert (await env.exec(command, 10, 1000)).stdout == "ok\n"
        assert await wait_for(lambda: pids_running(duration))
        # Until the subshell that started it has ended, the daemon is still a descendant of the command's
        # group, and close() would find it: what escapes is what outlives its whole command.
        assert await wait_for(lambda: not any(local._group_alive(g) for g in env._process_groups))
    escaped = pids_running(duration)
    for pid in escaped:
        os.kill(pid, 9)  # our own test's daemon, by pid
    assert escaped


def test_the_perl_subreaper_passes_strict_and_warnings():
    """subreaper.pl leaves out `use strict; use warnings` for start-up speed; it must still pass both."""
    perl = shutil.which("perl")
    if perl is None:
        pytest.skip("no perl here")
    script = Path(local.__file__).with_name("subreaper.pl")
    done = subprocess.run([perl, "-Mstrict", "-Mwarnings", "-c", str(script)], capture_output=True, text=True)
    assert done.returncode == 0 and "syntax OK" in done.stderr, done.stderr
    assert done.stderr.strip() == f"{script} syntax OK"  # no warning either


def test_a_command_that_leaves_nothing_leaves_no_group_to_clean_up(tmp_path):
    """The keeper is reaped by its front process (not left to init as a zombie, which keeps a process
    group looking alive), so the session holds no group after the command and its close has nothing
    to scan for."""

    async def main():
        env = make_env(tmp_path)
        async with env:
            for _ in range(3):
                result = await env.exec("echo ok", timeout_s=30, max_output_chars=1000)
                assert result.exit_code == 0
                assert env._process_groups == set()

    asyncio.run(main())


def test_a_background_job_keeps_its_group_until_close(tmp_path):
    marker = f"{uuid.uuid4().int % 10_000 + 20_000}.5"

    async def main():
        env = make_env(tmp_path)
        async with env:
            result = await env.exec(f"sleep {marker} &", timeout_s=30, max_output_chars=1000)
            assert result.exit_code == 0
            assert len(env._process_groups) == 1  # its keeper waits for the sleep
            assert pids_running(marker)
        assert not pids_running(marker)

    asyncio.run(main())
