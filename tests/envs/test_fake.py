"""FakeEnvironment: the conformance suite, and its shell subset checked against real bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conformance import EnvironmentConformance

from raygen.config import FakeEnvConfig
from raygen.envs import create_environment
from raygen.envs.base import EnvSpec
from raygen.envs.fake import FakeEnvironment
from raygen.errors import SessionFailure


def fake_factory(**spec_overrides) -> FakeEnvironment:
    spec_overrides.setdefault("session_key", "fake-test")
    return FakeEnvironment(FakeEnvConfig(), EnvSpec(**spec_overrides))


class TestFakeConformance(EnvironmentConformance):
    supports_processes = False

    @pytest.fixture
    def make_env(self):
        return fake_factory


# Commands inside the documented subset: the fake must print and exit exactly like bash does.
PARITY_COMMANDS = [
    "printf 'raygen-%s-%d\\n' abcd1234 $((6*7))",
    "printf '%s|' a b c; printf '\\n'",
    "printf '%d-%s\\n' 1 one 2 two 3",
    "printf '%5s|%-4d|%03d|100%%\\n' ab 7 5",
    "printf '%d\\n' notanumber",
    "echo $((7/2)) $((-7/2)) $((7%3)) $((-7%3)) $((2**10)) $(( (1+2)*3 - -4 ))",
    "echo $((1/0)); echo after",
    "echo $((1 +))",
    'echo \'single $HOME "x"\' "double \'y\' \\$ \\"q\\"" back\\ slash',
    "echo -n no-newline; echo",
    "echo a; echo b && echo c; false && echo skipped; false || echo rescued; true || echo skipped",
    "exit 5; echo unreachable",
    "mkdir -p a/b/c && mkdir a/x && ls a && ls a/b; mkdir a || echo exists",
    "mkdir nope/deeper",
    "echo hello > f.txt; echo world >> f.txt; cat f.txt; cat missing.txt || echo missing",
    "echo to-stderr >&2; echo to-stdout",
    "ls no-such-dir",
    "mkdir -p d/e; cd d && ls; cd e && ls; cd nowhere || echo stayed; cat ../e || pwd > /dev/null",
    "seq 3; seq 2 4; seq 10 -3 1",
    "true; false",
    "sleep 0.01 && echo slept",
    "nonexistent-command-xyz arg",
    "# only a comment",
    "echo one # trailing comment",
]


async def _fake_run(command: str) -> tuple[str, str, int]:
    async with fake_factory() as env:
        result = await env.exec(command, 10, 100_000)
    return result.stdout, result.stderr, result.exit_code


@pytest.mark.parametrize("command", PARITY_COMMANDS)
async def test_shell_subset_matches_bash(command: str, tmp_path: Path):
    real = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    stdout, stderr, code = await _fake_run(command)
    assert (stdout, code) == (real.stdout, real.returncode)
    assert bool(stderr) == bool(real.stderr)  # messages differ in wording, not in presence


@pytest.mark.parametrize("command", ["echo a | cat", "sleep 1 &", "echo 'unterminated"])
async def test_unsupported_or_broken_syntax_is_a_syntax_error(command: str):
    stdout, stderr, code = await _fake_run(command)
    assert code == 2 and stderr.startswith("fake:") and stdout == ""


async def test_simulator_command():
    stdout, _, code = await _fake_run("printf 'raygen-%s-%d\\n' abcd1234 $((6*7))")
    assert (stdout, code) == ("raygen-abcd1234-42\n", 0)


async def test_create_environment_selects_fake():
    env = create_environment(FakeEnvConfig(), EnvSpec(session_key="k"))
    assert isinstance(env, FakeEnvironment)


async def test_use_before_start_and_after_close_is_env_lost():
    env = fake_factory()
    with pytest.raises(SessionFailure) as before:
        await env.exec("true", 5, 100)
    async with env:
        await env.write_file("x", b"1")
    with pytest.raises(SessionFailure) as after:
        await env.read_file("x")
    assert before.value.kind == after.value.kind == "env_lost"


async def test_files_are_shared_between_api_and_shell_with_absolute_paths():
    async with fake_factory(cwd="/work") as env:
        await env.write_file("/etc/conf/app.ini", b"k=v\n")
        result = await env.exec("cat /etc/conf/app.ini ../etc/conf/app.ini; ls /etc/conf", 5, 1000)
        assert result.stdout == "k=v\nk=v\napp.ini\n"
