"""The file toolset: read_file, write_file, patch, search_files, through the Environment interface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.config import FakeEnvConfig, LocalEnvConfig
from raygen.envs.base import Environment, EnvSpec
from raygen.envs.fake import FakeEnvironment
from raygen.envs.local import LocalEnvironment
from raygen.tools.base import ToolContext, ToolResult
from raygen.tools.files import PatchTool, ReadFileTool, SearchFilesTool, WriteFileTool, file_toolset

READ, WRITE, PATCH, SEARCH = ReadFileTool(), WriteFileTool(), PatchTool(), SearchFilesTool()


def make_env(kind: str, root: Path) -> Environment:
    if kind == "fake":
        return FakeEnvironment(FakeEnvConfig(), EnvSpec(session_key="files"))
    return LocalEnvironment(LocalEnvConfig(root=root), EnvSpec(session_key="files"))


@pytest.fixture(params=["fake", "local"])
async def env(request: pytest.FixtureRequest, tmp_path: Path):
    async with make_env(request.param, tmp_path) as environment:
        yield environment


@pytest.fixture
async def local_env(tmp_path: Path):
    async with make_env("local", tmp_path) as environment:
        yield environment


async def call(tool, env: Environment, max_chars: int = 16_000, **args) -> tuple[ToolResult, dict]:
    result = await tool.run(args, ToolContext(env=env, output_max_chars=max_chars, default_timeout_s=20))
    return result, json.loads(result.content)


# --- write_file / read_file ------------------------------------------------------------------------


async def test_write_then_read_round_trip(env: Environment):
    content = "first\nsecond ünïcode\nthird\n"
    result, payload = await call(WRITE, env, path="dir/sub/notes.txt", content=content)
    assert result.ok and payload == {"bytes_written": len(content.encode())}
    assert await env.read_file("dir/sub/notes.txt") == content.encode()
    result, payload = await call(READ, env, path="dir/sub/notes.txt")
    assert result.ok and payload == {"content": content, "total_lines": 3, "truncated": False}


async def test_read_offset_and_limit(env: Environment):
    await env.write_file("lines.txt", "".join(f"line {i}\n" for i in range(1, 11)).encode())
    _, payload = await call(READ, env, path="lines.txt", offset=4, limit=3)
    assert payload["content"] == "line 4\nline 5\nline 6\n"
    assert payload["total_lines"] == 10 and payload["truncated"] is True and payload["next_offset"] == 7
    _, payload = await call(READ, env, path="lines.txt", offset=9)
    assert payload["content"] == "line 9\nline 10\n" and payload["truncated"] is False
    _, payload = await call(READ, env, path="lines.txt", offset=50)
    assert payload["content"] == "" and payload["total_lines"] == 10


async def test_read_large_file_fits_budget_and_continues(env: Environment):
    await env.write_file("big.txt", "".join(f'row "{i}"\n' for i in range(5000)).encode())
    result, payload = await call(READ, env, max_chars=2000, path="big.txt")
    assert len(result.content) <= 2000 and payload["truncated"] is True
    lines = payload["content"].splitlines()
    assert lines[0] == 'row "0"' and len(lines) == payload["next_offset"] - 1  # whole lines only
    _, following = await call(READ, env, max_chars=2000, path="big.txt", offset=payload["next_offset"])
    assert following["content"].startswith(f'row "{len(lines)}"\n')


async def test_read_binary_file_is_flagged(env: Environment):
    await env.write_file("blob.bin", b"\x89PNG\r\n\x1a\n\xff\xfe\x00abc")
    result, payload = await call(READ, env, path="blob.bin")
    assert result.ok and payload["binary"] is True and "abc" in payload["content"]


async def test_missing_files_and_directories_are_tool_errors(env: Environment):
    for tool, args in [
        (READ, {"path": "nope.txt"}),
        (PATCH, {"path": "nope.txt", "old_string": "a", "new_string": "b"}),
    ]:
        result, payload = await call(tool, env, **args)
        assert not result.ok and result.error_kind == "execution" and "nope.txt" in payload["error"]
    await env.write_file("folder/file.txt", b"x")
    result, payload = await call(READ, env, path="folder")
    assert not result.ok and "directory" in payload["error"]


# --- patch -----------------------------------------------------------------------------------------


async def test_patch_replaces_a_unique_occurrence(env: Environment):
    await env.write_file("code.py", b"def f():\n    return 1\n\ndef g():\n    return 2\n")
    result, payload = await call(PATCH, env, path="code.py", old_string="return 2", new_string="return 3")
    assert result.ok and payload == {"replacements": 1}
    assert await env.read_file("code.py") == b"def f():\n    return 1\n\ndef g():\n    return 3\n"


async def test_patch_refuses_missing_or_ambiguous_text(env: Environment):
    original = b"x = 1\ny = 1\nzzz\n"
    await env.write_file("vals.txt", original)
    result, payload = await call(PATCH, env, path="vals.txt", old_string="= 1", new_string="= 2")
    assert not result.ok and result.error_kind == "execution" and "2 times" in payload["error"]
    result, payload = await call(PATCH, env, path="vals.txt", old_string="zz", new_string="y")
    assert not result.ok and "2 times" in payload["error"]  # overlapping matches are ambiguous too
    result, payload = await call(PATCH, env, path="vals.txt", old_string="absent", new_string="y")
    assert not result.ok and "not found" in payload["error"]
    assert await env.read_file("vals.txt") == original


# --- search_files (needs grep: local backend) ------------------------------------------------------


async def test_search_finds_matches_with_line_numbers(local_env: Environment):
    await local_env.write_file("src/a.py", b"import os\nTODO: fix\n")
    await local_env.write_file("src/b.py", b"nothing\n")
    await local_env.write_file("src/c.bin", b"TODO\x00binary")
    result, payload = await call(SEARCH, local_env, pattern="TODO|import")
    assert result.ok and payload["count"] == 2
    assert sorted(payload["matches"].splitlines()) == ["./src/a.py:1:import os", "./src/a.py:2:TODO: fix"]
    _, payload = await call(SEARCH, local_env, pattern="nothing", path="src/b.py")
    assert payload == {"matches": "1:nothing\n", "count": 1}


async def test_search_without_match_is_success_with_zero(local_env: Environment):
    await local_env.write_file("f.txt", b"abc\n")
    result, payload = await call(SEARCH, local_env, pattern="xyz")
    assert result.ok and payload == {"matches": "", "count": 0}


async def test_search_pattern_and_path_cannot_inject_shell(local_env: Environment, tmp_path: Path):
    await local_env.write_file("f.txt", b"-n'; touch pwned; '\n")
    for pattern in ["'; touch pwned; '", "$(touch pwned)", "-n'; touch pwned; '"]:
        await call(SEARCH, local_env, pattern=pattern)
        await call(SEARCH, local_env, pattern="x", path=pattern)
    with pytest.raises(FileNotFoundError):
        await local_env.read_file("pwned")
    result, payload = await call(SEARCH, local_env, pattern="-n'; touch")  # a leading dash is a pattern
    assert result.ok and payload["count"] == 1


async def test_search_errors(local_env: Environment):
    result, payload = await call(SEARCH, local_env, pattern="x", path="no-such-dir")
    assert not result.ok and result.error_kind == "execution" and "no-such-dir" in payload["error"]
    result, _ = await call(SEARCH, local_env, pattern="(unclosed")
    assert not result.ok and result.error_kind == "execution"


async def test_search_count_is_exact_when_output_is_cut(local_env: Environment):
    await local_env.write_file("many.txt", b"hit\n" * 3000)
    result, payload = await call(SEARCH, local_env, max_chars=1000, pattern="hit")
    assert result.ok and payload["count"] == 3000 and payload["truncated"] is True
    assert len(result.content) <= 1000


# --- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        (READ, {}),
        (READ, {"path": 3}),
        (READ, {"path": "f", "offset": 0}),
        (READ, {"path": "f", "limit": "5"}),
        (WRITE, {"path": "f"}),
        (WRITE, {"path": "", "content": "x"}),
        (WRITE, {"path": "f", "content": "\ud800"}),
        (PATCH, {"path": "f", "old_string": "", "new_string": "x"}),
        (PATCH, {"path": "f", "old_string": "a"}),
        (SEARCH, {"pattern": ""}),
        (SEARCH, {"pattern": ["a"]}),
    ],
)
async def test_invalid_arguments(tool, args: dict, env: Environment):
    result, payload = await call(tool, env, **args)
    assert not result.ok and result.error_kind == "invalid_arguments" and payload["error"]


def test_toolset_shape():
    toolset = file_toolset()
    assert toolset.name == "file"
    assert [tool.name for tool in toolset.tools] == ["read_file", "write_file", "patch", "search_files"]
