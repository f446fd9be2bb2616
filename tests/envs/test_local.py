"""LocalEnvironment: the conformance suite (plain and under bubblewrap) plus local-only guarantees."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conformance import EnvironmentConformance, alive_host_pids, processes_inside

from raygen.config import LocalEnvConfig
from raygen.envs import create_environment
from raygen.envs.base import EnvSpec
from raygen.envs.local import LocalEnvironment, OutputCapture, bwrap_problem, command_environment
from raygen.errors import SessionFailure

BWRAP_PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap unusable: {BWRAP_PROBLEM}")


def local_factory(root: Path, **config):
    def make(**spec_overrides) -> LocalEnvironment:
        spec_overrides.setdefault("session_key", "local-test")
        return LocalEnvironment(LocalEnvConfig(root=root, **config), EnvSpec(**spec_overrides))

    return make


class TestLocalConformance(EnvironmentConformance):
    @pytest.fixture
    def make_env(self, tmp_path: Path):
        return local_factory(tmp_path)

    async def assert_cleaned_up(self, env, pids):
        await super().assert_cleaned_up(env, pids)
        assert env.workdir is not None and not env.workdir.exists()
        assert alive_host_pids(pids) == []
        assert processes_inside(str(env.workdir)) == []


@needs_bwrap
class TestLocalBwrapConformance(TestLocalConformance):
    @pytest.fixture
    def make_env(self, tmp_path: Path):
        return local_factory(tmp_path, bwrap=True)

    # Each bwrap command has a private pid namespace (old pids name new processes there): look for
    # leftovers from the host instead, by working directory.
    async def assert_cleaned_up(self, env, pids):
        await super().assert_cleaned_up(env, [])

    async def assert_processes_gone(self, env, pids):
        for _ in range(50):  # SIGKILL and the namespace teardown are asynchronous
            if not processes_inside(str(env.workdir)):
                break
            await asyncio.sleep(0.1)
        assert processes_inside(str(env.workdir)) == []


# --- local-only behaviour --------------------------------------------------------------------------


async def test_create_environment_selects_local(tmp_path: Path):
    env = create_environment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="k"))
    assert isinstance(env, LocalEnvironment)


async def test_workdir_layout_and_names(tmp_path: Path):
    spec = EnvSpec(session_key="sess42", run_name="myrun", cwd="/app/../../etc")
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path / "made"), spec) as env:
        assert env.workdir.parent == (tmp_path / "made").resolve()
        assert "myrun" in env.workdir.name and "sess42" in env.workdir.name
        assert (env.workdir / "home").is_dir() and (env.workdir / "tmp").is_dir()
        # ".." cannot climb out of the session: /app/../../etc re-roots to <workdir>/root/etc
        assert env.cwd == env.workdir / "root" / "etc"
        result = await env.exec('echo "$HOME|$TMPDIR"; pwd', 10, 1000)
        assert result.stdout == f"{env.workdir}/home|{env.workdir}/tmp\n{env.cwd}\n"


async def test_workdirs_resolve_a_symlinked_root_and_survive_its_removal(tmp_path: Path):
    # The parent is created and resolved once per process; removed meanwhile, it is made again.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    config = LocalEnvConfig(root=tmp_path / "link" / "runs")
    async with LocalEnvironment(config, EnvSpec(session_key="a")) as env:
        assert env.workdir.parent == (tmp_path / "real" / "runs").resolve()
        assert (await env.exec("pwd", 10, 1000)).stdout == f"{env.cwd}\n"
    (tmp_path / "real" / "runs").rmdir()
    async with LocalEnvironment(config, EnvSpec(session_key="b")) as env:
        assert env.cwd.is_dir() and env.workdir.parent == (tmp_path / "real" / "runs").resolve()
    assert not any((tmp_path / "real" / "runs").iterdir())


async def test_command_env_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("MY_SECRET_TOKEN", "tok-should-not-leak")
    monkeypatch.setenv("UNLISTED_VARIABLE", "unlisted-value")
    monkeypatch.setenv("LANG", "C.UTF-8")
    # Even when keep_env names it, a secret-looking host variable is not passed through ...
    config = LocalEnvConfig(root=tmp_path, keep_env=["PATH", "LANG", "MY_SECRET_TOKEN"])
    # ... but the row's own env may set one.
    spec = EnvSpec(session_key="scrub", env={"GITHUB_TOKEN": "row-provided"})
    async with LocalEnvironment(config, spec) as env:
        output = (await env.exec("env", 10, 100_000)).stdout
    assert "sk-should-not-leak" not in output and "OPENAI_API_KEY" not in output
    assert "tok-should-not-leak" not in output and "MY_SECRET_TOKEN" not in output
    assert "UNLISTED_VARIABLE" not in output
    assert "LANG=C.UTF-8" in output and "GITHUB_TOKEN=row-provided" in output


def test_secret_values_drop_variables_whatever_their_source():
    spec = EnvSpec(session_key="k", env={"ROW_VAR": "s3cret-value"}, secret_values=["s3cret-value", ""])
    host = {"LANG": "s3cret-value", "TZ": "UTC"}
    env = command_environment(["LANG", "TZ"], spec, "/h", "/t", host_env=host)
    assert env == {"PATH": env["PATH"], "TZ": "UTC", "HOME": "/h", "TMPDIR": "/t"}


async def test_background_child_returns_promptly_and_dies_at_close(tmp_path: Path):
    env = LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="bg"))
    async with env:
        result = await env.exec("sleep 30 & echo $! > bg.pid; echo started", 20, 1000)
        # returned after the shell exited, not at the timeout, although the sleep holds stdout
        assert not result.timed_out and result.exit_code == 0 and result.stdout == "started\n"
        pid = int(await env.read_file("bg.pid"))
        assert alive_host_pids([pid]) == [pid]  # background jobs outlive their command ...
    assert alive_host_pids([pid]) == []  # ... but not the session


async def test_close_kills_children_that_left_the_process_group(tmp_path: Path):
    env = LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="setsid"))
    async with env:
        await env.exec("setsid sleep 300 > /dev/null 2>&1 & echo $! > escaped.pid", 10, 1000)
        pid = int(await env.read_file("escaped.pid"))
        assert alive_host_pids([pid]) == [pid]
    assert alive_host_pids([pid]) == []


async def test_signal_exit_code_like_bash(tmp_path: Path):
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="sig")) as env:
        assert (await env.exec("kill -9 $$", 10, 1000)).exit_code == 137


async def test_stdin_is_empty(tmp_path: Path):
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="in")) as env:
        result = await env.exec("cat; echo done", 10, 1000)  # would block on a terminal or a pipe
        assert result.stdout == "done\n" and not result.timed_out


async def test_command_that_deletes_its_cwd_does_not_break_the_session(tmp_path: Path):
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="rm", cwd="w")) as env:
        await env.exec('rm -rf "$PWD"', 10, 1000)
        assert (await env.exec("echo alive", 10, 1000)).stdout == "alive\n"


async def test_absolute_paths_are_host_paths_without_bwrap(tmp_path: Path):
    outside = tmp_path / "outside.txt"
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path / "r"), EnvSpec(session_key="abs")) as env:
        await env.write_file(str(outside), b"on the host")
    assert outside.read_bytes() == b"on the host"


async def test_read_file_refuses_special_files(tmp_path: Path):
    async with LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="dev")) as env:
        with pytest.raises(OSError, match="not a regular file"):
            await env.read_file("/dev/zero")  # would never end
        await env.exec("mkfifo fifo", 10, 100)
        with pytest.raises(OSError, match="not a regular file"):
            await env.read_file("fifo")  # would block forever


def test_output_capture_memory_is_bounded():
    capture = OutputCapture(max_chars=1000)
    for i in range(10_000):
        capture.feed(f"{i:07d}\n".encode() * 1000)  # 80 MB in all
    assert len(capture.head) + len(capture.tail) <= 4 * 1000
    text, cut = capture.render()
    assert cut and len(text) <= 1000
    assert text.startswith("0000000\n") and text.endswith("0009999\n")


def test_remove_tree_copes_with_read_only_directories():
    top = Path(tempfile.mkdtemp(prefix="raygen-ro-"))
    try:
        (top / "ro" / "sub").mkdir(parents=True)
        (top / "ro" / "sub" / "file").write_text("x")
        (top / "link").symlink_to("/etc")
        for path in (top / "ro" / "sub", top / "ro"):
            path.chmod(0o500)
        code = (
            "import sys; from raygen.envs.host import remove_tree; "
            f"sys.exit(0 if remove_tree({str(top)!r}) else 1)"
        )
        argv = [sys.executable, "-c", code]
        if os.geteuid() == 0:
            # Root ignores permission bits; without these capabilities it is held to them like an owner.
            if shutil.which("setpriv") is None:
                pytest.skip("running as root and setpriv (util-linux) is missing to drop capabilities")
            argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *argv]
        assert subprocess.run(argv, timeout=60).returncode == 0
        assert not top.exists()
        assert Path("/etc").is_dir()
    finally:
        if top.exists():
            subprocess.run(["chmod", "-R", "u+rwx", str(top)], check=False)
            shutil.rmtree(top, ignore_errors=True)


# --- bubblewrap ------------------------------------------------------------------------------------


async def test_bwrap_unusable_fails_start_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no bwrap to be found
    env = LocalEnvironment(LocalEnvConfig(root=tmp_path, bwrap=True), EnvSpec(session_key="nobw"))
    with pytest.raises(SessionFailure) as failure:
        async with env:
            pass
    assert failure.value.kind == "env_start" and "bwrap" in str(failure.value)


@needs_bwrap
async def test_bwrap_confines_writes_network_and_tmp(tmp_path: Path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    marker = f"raygen-bwrap-{os.getpid()}-{port}"
    try:
        plain = LocalEnvironment(LocalEnvConfig(root=tmp_path), EnvSpec(session_key="plain"))
        boxed = LocalEnvironment(LocalEnvConfig(root=tmp_path, bwrap=True), EnvSpec(session_key="boxed"))
        async with plain, boxed:
            connect = f"echo hi > /dev/tcp/127.0.0.1/{port}"
            assert (await plain.exec(connect, 10, 1000)).exit_code == 0  # the probe itself works ...
            assert (await boxed.exec(connect, 10, 1000)).exit_code != 0  # ... but not in the sandbox
            # /var/tmp: host-writable and outside /tmp, which the sandbox replaces with its own
            escape = Path("/var/tmp", marker)
            assert (await boxed.exec(f"echo x > {escape}", 10, 1000)).exit_code != 0
            assert not escape.exists()
            with pytest.raises(PermissionError):
                await boxed.write_file(str(escape), b"x")
            assert not escape.exists()
            assert (await boxed.exec("echo inside > work.txt && cat work.txt", 10, 1000)).stdout == "inside\n"
            assert (await boxed.exec(f"echo private > /tmp/{marker}", 10, 1000)).exit_code == 0
            assert not Path("/tmp", marker).exists()
            assert (boxed.workdir / "tmp" / marker).read_text() == "private\n"
            assert await boxed.read_file(f"/tmp/{marker}") == b"private\n"
    finally:
        listener.close()
