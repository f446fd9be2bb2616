"""The command spawner (raygen/envs/spawner.py) through its client: real processes, no doubles.

What the local backend relies on: exit statuses as a shell reports them, separate bounded streams, the
exact environment and cwd asked for, background jobs that do not hold the call, a restart when the
spawner died, and the spawner ending with its actor (here: the socket's owner)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from raygen.envs import spawner_client
from raygen.envs.processes import kill_process_trees
from raygen.envs.spawner_client import RequestTooLarge, run_spawned, stop_spawner


@pytest.fixture(autouse=True)
def fresh_spawner():
    stop_spawner()
    yield
    stop_spawner()


async def run(command: str, cwd: Path, groups: set[int] | None = None, timeout_s: float = 30, **env: str):
    return await run_spawned(
        ["bash", "-c", command],
        env={"PATH": os.environ["PATH"], **env},
        cwd=cwd,
        timeout_s=timeout_s,
        max_output_chars=10_000,
        groups=set() if groups is None else groups,
    )


def text(capture) -> str:
    return capture.render()[0]


async def test_streams_status_cwd_and_environment_are_the_commands(tmp_path: Path):
    done = await run('echo "out $PWD $ONLY"; echo err >&2; env | sort > env.txt; exit 3', tmp_path, ONLY="x")
    assert done.returncode == 3 and not done.timed_out
    assert text(done.out) == f"out {tmp_path} x\n"
    assert text(done.err) == "err\n"
    # The command's environment is what was asked for, nothing of the spawner's (or the test's).
    names = {line.split("=", 1)[0] for line in (tmp_path / "env.txt").read_text().splitlines()}
    assert "ONLY" in names and "HOME" not in names and "PYTEST_CURRENT_TEST" not in names


async def test_the_keeper_carries_none_of_the_actors_environment(tmp_path: Path, monkeypatch):
    # A command can read its parent's environment (/proc/$PPID/environ, same user): the keeper's is the
    # spawner's, which starts empty, so a key in the session actor's environment cannot reach a
    # trajectory that way.
    monkeypatch.setenv("RAYGEN_TEST_ACTOR_SECRET", "s3cret-value")
    done = await run('tr "\\0" "\\n" < /proc/$PPID/environ; echo "parent $PPID"', tmp_path)
    assert done.returncode == 0 and "parent " in text(done.out)
    assert "s3cret-value" not in text(done.out)


async def test_a_signal_death_and_a_broken_pipe_end_as_in_a_shell(tmp_path: Path):
    killed = await run("kill -TERM $$", tmp_path)
    assert killed.returncode == -signal.SIGTERM
    # SIGPIPE is back to its default for the command (Python ignores it): `yes` ends when head does.
    piped = await run("yes | head -2", tmp_path, timeout_s=10)
    assert piped.returncode == 0 and not piped.timed_out and text(piped.out) == "y\ny\n"


async def test_a_missing_program_is_exit_127_with_a_message(tmp_path: Path):
    done = await run_spawned(
        ["no-such-program-raygen"],
        env={"PATH": "/usr/bin"},
        cwd=tmp_path,
        timeout_s=10,
        max_output_chars=1000,
        groups=set(),
    )
    assert done.returncode == 127
    assert "no-such-program-raygen" in text(done.err)


async def test_a_background_job_does_not_hold_the_call_and_stays_in_the_group(tmp_path: Path):
    groups: set[int] = set()
    started = time.monotonic()
    done = await run("sleep 30 & echo started", tmp_path, groups)
    assert done.returncode == 0 and text(done.out) == "started\n"
    assert time.monotonic() - started < 5
    # Its keeper still holds the job: the group stays recorded for the session's close to kill.
    assert groups == {done.pgid}
    assert kill_process_trees(groups) >= 2  # the keeper and the sleep


async def test_a_command_that_leaves_nothing_leaves_no_group(tmp_path: Path):
    groups: set[int] = set()
    done = await run("true", tmp_path, groups)
    assert done.returncode == 0 and groups == set()


async def test_a_timeout_kills_the_command_and_what_it_detached(tmp_path: Path):
    marker = f"1003.{os.getpid()}"
    done = await run(f"setsid sleep {marker} & sleep {marker}", tmp_path, timeout_s=0.5)
    assert done.timed_out and done.returncode is None
    await asyncio.sleep(0.2)
    assert not _running(marker)


async def test_a_dead_spawner_is_started_again(tmp_path: Path):
    assert (await run("echo one", tmp_path)).returncode == 0
    first = spawner_client._spawner.process
    first.kill()
    first.wait()
    done = await run("echo two", tmp_path)
    assert done.returncode == 0 and text(done.out) == "two\n"
    assert spawner_client._spawner.process.pid != first.pid


async def test_the_spawner_ends_with_its_socket(tmp_path: Path):
    await run("true", tmp_path)
    process = spawner_client._spawner.process
    spawner_client._spawner.socket.close()
    assert process.wait(timeout=5) == 0


async def test_a_request_too_large_for_the_socket_is_refused_before_anything_starts(tmp_path: Path):
    with pytest.raises(RequestTooLarge):
        await run("true", tmp_path, BIG="x" * 200_000)


def _running(argument: str) -> bool:
    for entry in os.listdir("/proc"):
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argument.encode() in words and state not in (b"Z", b"X"):
            return True
    return False
