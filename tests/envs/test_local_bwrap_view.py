"""What a bwrap session can see of the host, through commands and through the file tools (issue 15, case 3).

Only the system folders, a list of harmless /etc entries and the session's own workdir are mounted: no
/etc/shadow, no /root, no private key planted in the user's home, and the file tools act inside the same
view (no /proc/self/environ of the worker, no symlink out of the workdir).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from raygen.config import LocalEnvConfig
from raygen.envs.base import EnvSpec
from raygen.envs.local import LocalEnvironment, bwrap_problem

BWRAP_PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap unusable: {BWRAP_PROBLEM}")

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nplanted-by-raygen-test\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture
def planted_key():
    # In the home folder (outside /tmp, which the sandbox replaces): where real keys and credentials live.
    folder = Path.home() / f".raygen-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    key = folder / "id_ed25519"
    key.write_text(KEY)
    yield key
    key.unlink()
    folder.rmdir()


def boxed(tmp_path: Path, **config) -> LocalEnvironment:
    return LocalEnvironment(LocalEnvConfig(root=tmp_path, bwrap=True, **config), EnvSpec(session_key="view"))


async def test_commands_see_system_folders_but_no_host_secrets(tmp_path: Path, planted_key: Path):
    async with boxed(tmp_path) as env:
        for hidden in ("/etc/shadow", "/etc/gshadow", "/root/.ssh", str(planted_key), "/etc/ssl/private"):
            result = await env.exec(f"ls -d {hidden} && cat {hidden}", 10, 1000)
            assert result.exit_code != 0 and "PRIVATE KEY" not in result.stdout, hidden
        ok = await env.exec("grep -c '^root:' /etc/passwd && /usr/bin/env true && echo $HOME", 10, 1000)
        assert ok.exit_code == 0 and ok.stdout.splitlines()[0] == "1"
        assert ok.stdout.splitlines()[1] == str(env.workdir / "home")  # a private HOME
        listed = await env.exec("ls /", 10, 1000)
        assert not {"root", "home", "srv", "work", "opt"} & set(listed.stdout.split())


async def test_file_tools_see_what_commands_see(tmp_path: Path, planted_key: Path):
    async with boxed(tmp_path) as env:
        assert b"root:" in await env.read_file("/etc/passwd")
        for hidden in ("/etc/shadow", str(planted_key), "/proc/self/environ", "/proc/1/environ"):
            with pytest.raises(OSError):
                await env.read_file(hidden)
        # A link planted by a command cannot lead the file tools out of the sandbox's view.
        await env.exec(f"ln -s {planted_key} key-link && ln -s /proc/self/environ env-link", 10, 1000)
        for link in ("key-link", "env-link"):
            with pytest.raises(OSError):
                await env.read_file(link)
        with pytest.raises(PermissionError):
            await env.write_file("/etc/passwd", b"x")


async def test_bwrap_ro_binds_adds_a_read_only_path(tmp_path: Path, planted_key: Path):
    async with boxed(tmp_path, bwrap_ro_binds=[str(planted_key.parent)]) as env:
        result = await env.exec(f"cat {planted_key}", 10, 1000)
        assert result.exit_code == 0 and "planted-by-raygen-test" in result.stdout
        assert b"planted-by-raygen-test" in await env.read_file(str(planted_key))
        assert (await env.exec(f"echo x > {planted_key}", 10, 1000)).exit_code != 0


async def test_binds_are_writable_and_read_only_extras_under_tmp_are_shown(tmp_path: Path):
    # tmp_path lives under /tmp, which the sandbox replaces with the session's own: both must still show.
    shared, tools = tmp_path / "seat", tmp_path / "tools"
    shared.mkdir()
    tools.mkdir()
    (tools / "tool.sh").write_text("echo from-the-tool\n")
    (tmp_path / "unrelated.txt").write_text("not for the sandbox")
    spec = EnvSpec(session_key="binds", binds=[str(shared)])
    config = LocalEnvConfig(root=tmp_path / "work", bwrap=True, bwrap_ro_binds=[str(tools)])
    async with LocalEnvironment(config, spec) as env:
        wrote = await env.exec(f"echo in > {shared}/note && bash {tools}/tool.sh", 10, 1000)
        assert wrote.exit_code == 0 and wrote.stdout.strip() == "from-the-tool", wrote.stderr
        refused = await env.exec(f"touch {tools}/x", 10, 1000)
        assert refused.exit_code != 0  # read-only
        listed = await env.exec(f"ls {tmp_path}", 10, 1000)
        assert "unrelated.txt" not in listed.stdout.split()  # nothing else of the host's /tmp
    assert (shared / "note").read_text() == "in\n"
