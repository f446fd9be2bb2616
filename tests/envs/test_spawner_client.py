"""The command spawner (raygen/envs/spawner.py) through its client: real processes, no doubles.

What the local backend relies on: exit statuses as a shell reports them, separate bounded streams, the
exact environment and cwd asked for, background jobs that do not hold the call, a restart when the
spawner died, and the spawner ending with its actor (here: the socket's owner)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from raygen.envs import spawner_client
from raygen.envs.processes import kill_process_trees
from raygen.envs.spawner_client import RequestTooLarge, SpawnerUnavailable, run_spawned, stop_spawner


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


async def run_program(program: str, path: str, cwd: Path):
    """``program`` with no arguments, with only ``PATH`` in its environment."""
    return await run_spawned(
        [program], env={"PATH": path}, cwd=cwd, timeout_s=10, max_output_chars=1000, groups=set()
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
    done = await run_program("no-such-program-raygen", "/usr/bin", tmp_path)
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


async def test_the_program_is_looked_up_in_the_commands_path(tmp_path: Path):
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "raygen-tool").write_text("#!/bin/sh\necho from-the-session-path\n")
    (tools / "raygen-tool").chmod(0o755)
    done = await run_program("raygen-tool", f"{tools}:/usr/bin:/bin", tmp_path)
    assert done.returncode == 0 and text(done.out) == "from-the-session-path\n"


async def test_the_keeper_is_no_python_and_holds_nothing_of_the_actor(tmp_path: Path):
    # `pkill python` in one session must not take every session's keeper; its stderr is not the actor's log.
    done = await run("cat /proc/$PPID/comm; readlink /proc/$PPID/fd/2", tmp_path)
    assert text(done.out) == "raygen-keeper\n/dev/null\n"


async def test_a_command_that_kills_its_own_group_ends_as_it_did_under_the_script(tmp_path: Path):
    # The keeper shares the command's group: SIGTERM to the group ends the command alone (the keeper
    # ignores it) and SIGKILL ends both, reported as the scripts did (killed, 137), not as a timeout.
    trapped = await run("trap 'kill 0' EXIT; echo bye", tmp_path)
    assert trapped.returncode == -signal.SIGTERM and text(trapped.out) == "bye\n" and not trapped.timed_out
    killed = await run("kill -9 0", tmp_path)
    assert killed.returncode == -signal.SIGKILL and not killed.timed_out


async def test_a_nul_byte_is_the_callers_error_as_when_starting_the_program_directly(tmp_path: Path):
    with pytest.raises(ValueError, match="null byte"):
        await run("echo a\0b", tmp_path)


async def test_a_cancellation_before_the_keeper_was_heard_from_still_kills_the_command(tmp_path: Path):
    marker = tmp_path / "survived"
    task = asyncio.create_task(run(f"sleep 1; echo survived > {marker}", tmp_path))
    await asyncio.sleep(0)  # the request is sent
    time.sleep(0.3)  # the loop is busy: the keeper's pid waits unread in the pipe, the command runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(1.5)
    assert not marker.exists()


async def test_a_wedged_spawner_is_given_up_and_nothing_it_was_sent_runs_later(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(spawner_client, "START_TIMEOUT_S", 0.5)
    assert (await run("true", tmp_path)).returncode == 0
    wedged = spawner_client._spawner.process
    os.kill(wedged.pid, signal.SIGSTOP)
    marker = tmp_path / "ran"
    try:
        with pytest.raises(SpawnerUnavailable):
            await run(f"echo ran > {marker}", tmp_path)
        with pytest.raises(SpawnerUnavailable, match="did not answer"):  # not used again in this process
            await run("true", tmp_path)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(wedged.pid, signal.SIGCONT)
    await asyncio.sleep(0.5)
    assert not marker.exists()


async def test_a_spawner_that_cannot_start_leaves_the_command_to_the_script(tmp_path: Path, monkeypatch):
    broken = tmp_path / "broken_spawner.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(spawner_client, "SPAWNER", str(broken))
    for _ in range(spawner_client.MAX_START_FAILURES):
        with pytest.raises(SpawnerUnavailable):
            await run("true", tmp_path)
    with pytest.raises(SpawnerUnavailable, match="keeps dying"):
        await run("true", tmp_path)
    # The local backend runs it anyway, through the script.
    from raygen.config import LocalEnvConfig
    from raygen.envs.base import EnvSpec
    from raygen.envs.local import LocalEnvironment

    async with LocalEnvironment(LocalEnvConfig(root=tmp_path / "wd"), EnvSpec(session_key="s")) as env:
        result = await env.exec("echo still-runs", 10, 1000)
    assert result.exit_code == 0 and result.stdout == "still-runs\n"


async def test_a_relative_path_entry_is_searched_from_the_commands_cwd(tmp_path: Path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "raygen-local-tool").write_text("#!/bin/sh\necho relative\n")
    (tmp_path / "bin" / "raygen-local-tool").chmod(0o755)
    done = await run_program("raygen-local-tool", "bin:/usr/bin:/bin", tmp_path)
    assert done.returncode == 0 and text(done.out) == "relative\n"
