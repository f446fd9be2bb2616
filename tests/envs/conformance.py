"""The conformance suite every Environment backend runs.

Subclass ``EnvironmentConformance`` in a test file (``class TestMyBackend(EnvironmentConformance)``) and
override the ``make_env`` fixture to return a factory ``make_env(**spec_overrides) -> Environment`` (not
started; the overrides are EnvSpec fields such as ``cwd`` or ``env``). Capability flags skip what a backend
cannot do; ``assert_cleaned_up`` can be overridden to check the backend's real resources.

The tests only use the Environment API and a POSIX shell with coreutils (``seq``, ``sleep``, ``cat``), so
they also hold for container backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable

import pytest

from raygen.envs.base import Environment

MakeEnv = Callable[..., Environment]

# Prints the pids from pids.txt that are still alive (zombies count as dead: nobody may reap them
# in a container), polling for up to ~5 s so a SIGKILL has time to land.
ALIVE_CHECK = (
    "for i in $(seq 50); do alive=''; for p in $(cat pids.txt); do "
    "if [ -e /proc/$p ] && ! grep -q '^State:[[:space:]]*Z' /proc/$p/status 2>/dev/null; "
    'then alive="$alive $p"; fi; done; [ -z "$alive" ] && break; sleep 0.1; done; echo "alive:$alive"'
)


class EnvironmentConformance:
    """Backend-agnostic behaviour of the Environment seam (see raygen/envs/base.py)."""

    supports_processes: bool = True
    """Real processes: children, background jobs, /proc. The fake backend has none."""

    @pytest.fixture
    def make_env(self) -> MakeEnv:
        raise NotImplementedError("override the make_env fixture in the backend's test class")

    @pytest.fixture
    async def new_env(self, make_env: MakeEnv):
        """make_env with unique session keys; whatever a test leaves open is closed afterwards."""
        created: list[Environment] = []

        def factory(**spec_overrides) -> Environment:
            spec_overrides.setdefault("session_key", f"conf-{uuid.uuid4().hex[:8]}")
            env = make_env(**spec_overrides)
            created.append(env)
            return env

        yield factory
        for env in created:
            await env.close()

    async def assert_cleaned_up(self, env: Environment, pids: list[int]) -> None:
        """After close(): the environment refuses work. Backends add checks of their real resources
        (``pids`` are the in-environment pids of processes that were running when it was closed)."""
        with pytest.raises(Exception):  # noqa: B017 - which error is the backend's choice
            await env.exec("true", 5, 1000)

    async def assert_processes_gone(self, env: Environment, pids: list[str]) -> None:
        """The processes with these in-environment pids are dead (checked from a new command). Override
        when each command gets its own pid namespace, where old pids name new processes."""
        assert (await self.run(env, ALIVE_CHECK)).stdout == "alive:\n"

    def require_processes(self) -> None:
        if not self.supports_processes:
            pytest.skip(f"{type(self).__name__} has no real processes (supports_processes = False)")

    @staticmethod
    async def run(env: Environment, command: str, timeout_s: float = 20, max_chars: int = 10**4):
        return await env.exec(command, timeout_s, max_chars)

    # --- exec -------------------------------------------------------------------------------------

    async def test_stdout_stderr_and_exit_code(self, new_env: MakeEnv):
        async with new_env() as env:
            result = await self.run(env, "echo out; echo err >&2; exit 3")
            assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
            assert not result.timed_out and not result.truncated
            assert (await self.run(env, "true")).exit_code == 0
            assert (await self.run(env, "false")).exit_code == 1

    async def test_unknown_command_is_127(self, new_env: MakeEnv):
        async with new_env() as env:
            result = await self.run(env, "raygen-no-such-command-xyz")
            assert result.exit_code == 127
            assert "not found" in result.stderr

    async def test_shell_sequencing_quotes_and_arithmetic(self, new_env: MakeEnv):
        async with new_env() as env:
            # the simulator's canonical command
            result = await self.run(env, "printf 'raygen-%s-%d\\n' abcd1234 $((6*7))")
            assert result.stdout == "raygen-abcd1234-42\n"
            result = await self.run(env, "false && echo skipped; echo 'a  b' \"c $((2+3*4))\"")
            assert result.stdout == "a  b c 14\n"

    async def test_timeout_is_reported(self, new_env: MakeEnv):
        async with new_env() as env:
            result = await self.run(env, "echo before; sleep 30", timeout_s=1)
            assert result.timed_out and result.exit_code == 124
            assert (await self.run(env, "echo still usable")).stdout == "still usable\n"

    async def test_timeout_kills_child_processes(self, new_env: MakeEnv):
        self.require_processes()
        async with new_env() as env:
            command = "sleep 30 & echo $! > pids.txt; sh -c 'echo $$ >> pids.txt; exec sleep 30'"
            result = await self.run(env, command, timeout_s=2)
            assert result.timed_out
            pids = (await env.read_file("pids.txt")).split()
            assert len(pids) == 2, "both sleeps should have started within the timeout"
            await self.assert_processes_gone(env, [p.decode() for p in pids])

    async def test_background_child_does_not_hang_exec(self, new_env: MakeEnv):
        self.require_processes()
        async with new_env() as env:
            # The background sleep inherits stdout; exec must still come back (done or timed out).
            result = await asyncio.wait_for(self.run(env, "sleep 30 & echo started", timeout_s=5), 30)
            assert "started" in result.stdout

    async def test_output_is_capped_head_and_tail(self, new_env: MakeEnv):
        async with new_env() as env:
            result = await self.run(env, "seq 1 300000", max_chars=2000)
            assert result.truncated and result.exit_code == 0
            assert len(result.stdout) <= 2000
            assert result.stdout.startswith("1\n2\n3\n")
            assert result.stdout.endswith("299999\n300000\n")

    # --- cwd, env ---------------------------------------------------------------------------------

    @pytest.mark.parametrize("cwd", ["sub/dir", "/srv/app"])
    async def test_cwd_is_honoured_by_exec_and_files(self, new_env: MakeEnv, cwd: str):
        async with new_env(cwd=cwd) as env:
            assert (await self.run(env, "pwd")).stdout.rstrip("\n").endswith(cwd.rstrip("/"))
            await env.write_file("from-api.txt", b"api\n")
            assert (await self.run(env, "cat from-api.txt")).stdout == "api\n"
            await self.run(env, "echo shell > from-shell.txt")
            assert await env.read_file("from-shell.txt") == b"shell\n"

    async def test_env_is_honoured(self, new_env: MakeEnv):
        async with new_env(env={"GREETING": "hello world"}) as env:
            assert (await self.run(env, 'echo "$GREETING"')).stdout == "hello world\n"
            assert (await self.run(env, 'echo "[$HOME]"')).stdout not in ("[]\n", "")

    async def test_host_secrets_and_secret_values_never_reach_commands(
        self, new_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
    ):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
        monkeypatch.setenv("MY_SECRET_TOKEN", "tok-should-not-leak")
        async with new_env(env={"ROW_VALUE": "row-secret-value"}, secret_values=["row-secret-value"]) as env:
            result = await self.run(env, 'echo "[$OPENAI_API_KEY][$MY_SECRET_TOKEN][$ROW_VALUE]"')
            assert result.stdout == "[][][]\n"

    # --- files ------------------------------------------------------------------------------------

    async def test_text_and_binary_files_round_trip(self, new_env: MakeEnv):
        async with new_env() as env:
            text = "héllo wörld\nline 2\n".encode()
            blob = bytes(range(256)) * 64 + b"\x00\xff\r\n"
            await env.write_file("text.txt", text)
            await env.write_file("nested/deeper/blob.bin", blob)
            assert await env.read_file("text.txt") == text
            assert await env.read_file("nested/deeper/blob.bin") == blob
            await env.write_file("text.txt", b"replaced")
            assert await env.read_file("text.txt") == b"replaced"
            assert (await self.run(env, "cat text.txt")).stdout == "replaced"

    async def test_missing_file_and_directory_errors(self, new_env: MakeEnv):
        async with new_env() as env:
            with pytest.raises(FileNotFoundError):
                await env.read_file("does-not-exist.txt")
            await env.write_file("folder/inside.txt", b"x")
            with pytest.raises(IsADirectoryError):
                await env.read_file("folder")

    # --- isolation and lifetime -------------------------------------------------------------------

    async def test_sessions_are_isolated(self, new_env: MakeEnv):
        async with new_env() as first, new_env() as second:
            await first.write_file("shared.txt", b"first only")
            await self.run(first, "echo first > by-shell.txt")
            with pytest.raises(FileNotFoundError):
                await second.read_file("shared.txt")
            assert (await self.run(second, "cat by-shell.txt")).exit_code != 0

    async def test_close_is_idempotent_and_safe_without_start(self, new_env: MakeEnv):
        never_started = new_env()
        await never_started.close()
        await never_started.close()
        env = new_env()
        async with env:
            await self.run(env, "true")
        await env.close()
        await self.assert_cleaned_up(env, [])

    async def test_cancellation_mid_exec_cleans_up(self, new_env: MakeEnv):
        env = new_env()
        running = asyncio.Event()
        command = "echo $$ > pids.txt; sleep 30" if self.supports_processes else "sleep 30"

        async def session() -> None:
            async with env:
                running.set()
                await self.run(env, command, timeout_s=60)

        task = asyncio.create_task(session())
        await asyncio.wait_for(running.wait(), 30)
        pids: list[int] = []
        if self.supports_processes:  # wait until the command is really running
            deadline = time.monotonic() + 60
            while not pids and time.monotonic() < deadline and not task.done():
                # The shell creates pids.txt before echo writes it: an empty read means "not yet".
                with contextlib.suppress(FileNotFoundError, ValueError):
                    pids = [int(p) for p in (await env.read_file("pids.txt")).split()]
                if not pids:
                    await asyncio.sleep(0.05)
            assert pids, "the command never started" + (f": {task.exception()!r}" if task.done() else "")
        else:
            await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await self.assert_cleaned_up(env, pids)
        await env.close()  # still idempotent afterwards

    # --- grading (raygen/verify): both modes through this seam --------------------------------------

    async def _agent_leaves(self, new_env: MakeEnv) -> Environment:
        agent = new_env()
        await agent.start()
        await agent.write_file("answer.txt", b"42\n")  # the declared artifact
        await agent.write_file("extra.txt", b"not an artifact\n")
        await agent.write_file("hidden.txt", b"0\n")  # the agent's own copy of the hidden file
        return agent

    async def test_grading_fresh_mode_sees_only_artifacts_and_hidden_files(self, new_env: MakeEnv):
        from raygen.input.verify_spec import VerifySpec
        from raygen.verify.grader import grade

        agent = await self._agent_leaves(new_env)
        spec = dict(files={"hidden.txt": "1\n"}, artifacts=["answer.txt"], mode="fresh", result="last_line")
        graded = await grade(
            VerifySpec(command="cat answer.txt hidden.txt", **spec), agent_env=agent, open_fresh=new_env
        )
        assert (graded.reward, graded.verification.mode) == (1.0, "fresh")  # the artifact, then the hidden 1
        assert [a.path for a in graded.artifacts] == ["answer.txt"]
        extra = await grade(
            VerifySpec(command="cat extra.txt", **{**spec, "result": "exit_code"}),
            agent_env=agent,
            open_fresh=new_env,
        )
        assert extra.reward == 0.0 and extra.verification.exit_code != 0  # not copied
        assert (await agent.read_file("hidden.txt")) == b"0\n"  # the agent's environment was not touched

    async def test_grading_same_mode_writes_hidden_files_over_the_agents(self, new_env: MakeEnv):
        from raygen.input.verify_spec import VerifySpec
        from raygen.verify.grader import grade

        agent = await self._agent_leaves(new_env)
        spec = VerifySpec(
            command="cat extra.txt hidden.txt", files={"hidden.txt": "1\n"}, mode="same", result="last_line"
        )
        graded = await grade(spec, agent_env=agent, open_fresh=new_env)
        assert (graded.reward, graded.verification.mode) == (1.0, "same")
        assert (await agent.read_file("hidden.txt")) == b"1\n"


def alive_host_pids(pids: list[int]) -> list[int]:
    """Host pids still running (zombies count as dead): for backends whose pids are host pids."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def processes_inside(directory: str) -> list[int]:
    """Host pids of live processes whose cwd is inside ``directory`` (needs permission to read /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        inside = cwd == directory or cwd.startswith(directory.rstrip("/") + "/")
        if inside and alive_host_pids([int(entry)]):
            found.append(int(entry))
    return found
