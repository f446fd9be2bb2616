"""The MCP configuration: the shared ``mcpServers`` JSON, ``${VAR}`` secrets, tool names, rows' own
servers, and how the servers' toolsets join every session's draw."""

from __future__ import annotations

import json

import pytest

from raygen.config import ModalEnvConfig, RunConfig
from raygen.envs import EnvSpec, create_environment
from raygen.errors import ConfigError
from raygen.input.rows import PromptRow
from raygen.tools.distributions import load_distribution
from raygen.tools.mcp_config import (
    configured_servers,
    load_server_file,
    parse_servers,
    referenced_values,
    tool_name,
)


def test_the_shared_client_format_is_read_as_is(tmp_path):
    path = tmp_path / "servers.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "git": {"command": "uvx", "args": ["mcp-server-git"], "autoApprove": [], "timeout": 60},
                    "remote": {"url": "https://example.invalid/mcp", "headers": {"X": "${TOKEN}"}},
                    "sse": {"type": "sse", "url": "http://127.0.0.1:1/sse"},
                    "off": {"command": "x", "disabled": True},
                }
            }
        )
    )
    servers = load_server_file(path)
    assert sorted(servers) == ["git", "remote", "sse"]  # disabled ones are skipped
    assert servers["git"].transport == "stdio" and servers["git"].placement == "session"
    assert servers["remote"].transport == "http" and servers["remote"].placement == "remote"
    assert servers["sse"].transport == "sse"
    assert servers["remote"].references() == {"TOKEN"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"args": ["x"]}, "exactly one of 'command'"),
        ({"command": "x", "url": "http://a"}, "exactly one of 'command'"),
        ({"url": "ftp://a"}, "http:// or https://"),
        ({"command": "x", "type": "sse"}, "needs a 'url'"),
        ({"url": "http://a", "shared": True}, "'shared' is for stdio"),
        ({"command": "x", "cmd": "typo"}, "cmd"),
    ],
)
def test_bad_server_is_named_with_its_field(spec, message):
    with pytest.raises(ConfigError, match=r"servers.json: MCP server 'bad'") as caught:
        parse_servers({"mcpServers": {"bad": spec}}, "servers.json")
    assert message in str(caught.value)


def test_server_names_become_toolset_names():
    with pytest.raises(ConfigError, match="letters, digits"):
        parse_servers({"mcpServers": {"has space": {"command": "x"}}}, "f")
    assert tool_name("{server}__{tool}", "git", "git.status/v2") == "git__git_status_v2"
    assert len(tool_name("{server}__{tool}", "s" * 40, "t" * 40)) == 64


def test_variables_are_read_from_the_driver_and_a_missing_one_stops_the_run():
    servers = parse_servers({"s": {"command": "x", "env": {"A": "${ONE}-${TWO}"}}}, "f")
    values = referenced_values(servers.values(), ["EXTRA"], {"ONE": "1", "TWO": "2", "EXTRA": "e"})
    assert values == {"ONE": "1", "TWO": "2", "EXTRA": "e"}
    assert servers["s"].resolved(values).env == {"A": "1-2"}
    with pytest.raises(ConfigError, match=r"\$\{TWO\}, which is not set"):
        referenced_values(servers.values(), [], {"ONE": "1"})


def test_config_section_and_files_combine_and_refuse_duplicates(tmp_path):
    path = tmp_path / "more.json"
    path.write_text(json.dumps({"mcpServers": {"b": {"command": "y"}}}))
    config = RunConfig.model_validate({"tools": {"mcp_servers": {"mcpServers": {"a": {"command": "x"}}}}})
    assert sorted(configured_servers(config.tools.mcp_servers, [path])) == ["a", "b"]
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "y"}}}))
    with pytest.raises(ConfigError, match=r"'a' of .* is already defined"):
        configured_servers(config.tools.mcp_servers, [path])
    with pytest.raises(ValueError, match=r"must contain \{tool\}"):
        RunConfig.model_validate({"tools": {"mcp_tool_name_format": "{server}"}})


def test_row_servers_validate_and_change_only_their_rows_key():
    plain = PromptRow(prompt="p")
    assert PromptRow(prompt="p", mcp_servers=None).content_hash() == plain.content_hash()
    row = PromptRow(prompt="p", mcp_servers={"mcpServers": {"t": {"command": "x"}}})
    assert row.mcp_servers["t"].command == "x" and row.content_hash() != plain.content_hash()
    with pytest.raises(ValueError, match="letters, digits"):
        PromptRow(prompt="p", mcp_servers={"a b": {"command": "x"}})


def test_servers_are_added_to_every_draw_unless_the_distribution_names_them():
    known = {"terminal", "file", "git"}
    heavy = load_distribution("terminal_heavy", known, always=["git"])
    draws = [heavy.draw(0, f"key{i}") for i in range(30)]
    assert all("git" in d and "terminal" in d for d in draws)
    assert any("file" not in d for d in draws)  # the distribution still draws the rest
    assert heavy.probabilities()["git"] == 100.0


async def test_backends_without_processes_refuse_stdio_servers_clearly():
    env = create_environment(ModalEnvConfig(), EnvSpec(session_key="k"))
    with pytest.raises(ConfigError, match=r"env.type=modal cannot run a stdio MCP server"):
        await env.open_process(["x"], {}, None)


def test_harbor_task_mcp_servers_become_the_rows_servers(tmp_path):
    import shutil
    from pathlib import Path

    from raygen.verify.harbor import read_task

    task = tmp_path / "with-mcp"
    shutil.copytree(Path(__file__).parents[1] / "data" / "harbor" / "add-numbers", task)
    toml = (task / "task.toml").read_text()
    toml += (
        '\n[[environment.mcp_servers]]\nname = "time"\ntransport = "stdio"\ncommand = "mcp-server-time"\n'
        '\n[[environment.mcp_servers]]\nname = "remote"\ntransport = "streamable-http"\n'
        'url = "http://mcp-server:8000/mcp"\n'
    )
    (task / "task.toml").write_text(toml)
    problems: list[str] = []
    found = read_task(task, problems)
    assert not problems and found is not None
    row = PromptRow.model_validate(found.row)
    assert row.mcp_servers["time"].command == "mcp-server-time"
    assert row.mcp_servers["remote"].transport == "http"
    (task / "task.toml").write_text(toml.replace('"streamable-http"', '"carrier-pigeon"'))
    problems = []
    assert read_task(task, problems) is None and "environment.mcp_servers[1].transport" in problems[0]


async def test_preflight_refuses_stdio_servers_on_a_backend_without_processes_before_any_sandbox():
    from raygen.tools.mcp_preflight import preflight_servers

    servers = parse_servers({"git": {"command": "mcp-server-git"}}, "f")
    with pytest.raises(
        ConfigError, match=r"env.type=modal cannot run stdio MCP servers in a session \(git\)"
    ):
        await preflight_servers(
            servers, {}, ModalEnvConfig(), run_name="t", name_format="{server}__{tool}", start_timeout_s=5
        )
