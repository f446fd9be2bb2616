"""MCP servers in sessions on the local backend, with and without bubblewrap: real servers from PyPI
(mcp-server-time, mcp-server-git) and the misbehaving scripted server; no Ray."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from raygen.config import LocalEnvConfig
from raygen.envs.local import bwrap_problem
from raygen.errors import ConfigError
from tests.mcp.helpers import (
    DONE,
    ListModel,
    assert_none_inside,
    call,
    git_server,
    mcp_runner,
    sample,
    scripted,
    time_server,
    tool_messages,
    turn,
    venv_binds,
)

BWRAP = [False] + ([True] if shutil.which("bwrap") and not bwrap_problem() else [])


def local(tmp_path, bwrap: bool) -> LocalEnvConfig:
    return LocalEnvConfig(root=str(tmp_path), bwrap=bwrap, bwrap_ro_binds=venv_binds() if bwrap else [])


@pytest.mark.parametrize("bwrap", BWRAP, ids=lambda on: "bwrap" if on else "bare")
async def test_time_server_tools_are_offered_called_and_counted(tmp_path, bwrap):
    model = ListModel(
        [
            turn(
                call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "a"),
                call("time__get_current_time", {"timezone": "Nowhere/Invalid"}, "b"),
                call(
                    "time__convert_time",
                    {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Kolkata"},
                    "c",
                ),
            ),
            DONE,
        ]
    )
    runner = await mcp_runner({"time": time_server()}, local(tmp_path, bwrap), model)
    record = await runner.run(sample(["terminal", "time"]))
    assert record.exit_status == "completed", record.error
    offered = {t["function"]["name"]: t["function"] for t in model.seen_tools[0]}
    assert {"terminal", "time__get_current_time", "time__convert_time"} <= set(offered)
    assert "timezone" in offered["time__get_current_time"]["parameters"]["properties"]  # the server's schema
    results = tool_messages(record)
    assert json.loads(results["a"])["timezone"] == "Asia/Tokyo"
    assert "error" in json.loads(results["b"]) and "Nowhere/Invalid" in results["b"]  # isError -> failure
    assert "+05:30" in results["c"] or "17:30" in results["c"]
    assert record.tool_stats["time__get_current_time"].model_dump() == {
        "count": 2,
        "success": 1,
        "failure": 1,
    }
    assert record.tool_error_counts == {"execution": 1}
    assert [s["name"] for s in record.mcp_servers] == ["time"]
    assert (
        record.mcp_servers[0]["placement"] == "session" and "mcp-time" in record.mcp_servers[0]["server_info"]
    )
    assert "time__convert_time" in record.conversations[0]["value"]  # the schemas in the system turn
    assert_none_inside(tmp_path)


@pytest.mark.parametrize("bwrap", BWRAP, ids=lambda on: "bwrap" if on else "bare")
async def test_git_tool_changes_only_the_sessions_own_workdir(tmp_path, bwrap):
    """Two sessions each make a repository in their workdir; the git server's commit lands in its own
    session's repository, not in the other's and not in the folder the test (the host) runs in."""
    setup = "git init -q && git config user.email t@e && git config user.name t && echo hi > a.txt"

    def script(message: str) -> ListModel:
        return ListModel(
            [
                turn(call("terminal", {"command": setup}, "init")),
                turn(call("git__git_add", {"repo_path": ".", "files": ["a.txt"]}, "add")),
                turn(call("git__git_commit", {"repo_path": ".", "message": message}, "commit")),
                turn(call("terminal", {"command": "git log --format=%s && pwd"}, "log")),
                DONE,
            ]
        )

    runner = await mcp_runner({"git": git_server()}, local(tmp_path, bwrap), script("first"))
    first = await runner.run(sample(["terminal", "git"], key="a"))
    runner.model = script("second")
    second = await runner.run(sample(["terminal", "git"], key="b"))
    for record, message in ((first, "first"), (second, "second")):
        assert record.exit_status == "completed", record.error
        log = json.loads(tool_messages(record)["log"])["output"].split("\n")
        assert log[0] == message  # its own commit only: one line, then pwd
        assert record.tool_stats["git__git_commit"].success == 1
    workdirs = {json.loads(tool_messages(r)["log"])["output"].split("\n")[1] for r in (first, second)}
    assert len(workdirs) == 2 and all(w.startswith(str(tmp_path)) for w in workdirs)
    host = subprocess.run(["git", "-C", str(tmp_path), "log"], capture_output=True, text=True)
    assert host.returncode != 0  # the host folder holding the sessions got no repository
    assert_none_inside(tmp_path)


async def test_server_started_only_when_called_and_stopped_with_its_children(tmp_path):
    model = ListModel([turn(call("scripted__pid", {}, "p")), DONE])
    runner = await mcp_runner({"scripted": scripted("child")}, local(tmp_path, False), model)
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "completed", record.error
    pids = json.loads(tool_messages(record)["p"])
    assert pids["child"]  # the server's detached child ran in the session ...
    assert_none_inside(tmp_path)  # ... and neither outlived it
    unused = ListModel([DONE])
    runner.model = unused
    assert (await runner.run(sample(["scripted"], key="u"))).exit_status == "completed"


async def test_junk_on_stdout_is_tolerated_and_images_become_placeholders(tmp_path):
    model = ListModel(
        [turn(call("scripted__echo", {"text": "hello"}, "e"), call("scripted__image", {}, "i")), DONE]
    )
    runner = await mcp_runner({"scripted": scripted("junk")}, local(tmp_path, False), model)
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "completed", record.error
    results = tool_messages(record)
    assert results["e"] == "hello"
    assert results["i"].startswith("[image image/png, 5 bytes")
    assert record.tool_stats["scripted__echo"].success == 1


async def test_server_that_dies_mid_session_ends_it_retryably(tmp_path):
    model = ListModel(
        [turn(call("scripted__echo", {"text": "x"}, "e")), turn(call("scripted__crash", {}, "c")), DONE]
    )
    runner = await mcp_runner({"scripted": scripted()}, local(tmp_path, False), model)
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "error:mcp_server_lost"
    assert "'scripted' ended" in record.error and "crashing now" in record.error  # its stderr tail
    assert_none_inside(tmp_path)


async def test_server_that_hangs_mid_session_ends_it_after_the_call_timeout(tmp_path):
    model = ListModel([turn(call("scripted__hang", {}, "h")), DONE])
    runner = await mcp_runner({"scripted": scripted()}, local(tmp_path, False), model, mcp_call_timeout_s=1)
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "error:mcp_server_lost"
    assert "stopped answering" in record.error
    assert_none_inside(tmp_path)


async def test_protocol_error_of_one_call_is_a_tool_failure(tmp_path):
    model = ListModel([turn(call("scripted__echo", {"text": "x"}, "e")), DONE])
    runner = await mcp_runner({"scripted": scripted()}, local(tmp_path, False), model)
    # The offered name maps to a tool the server no longer has: it answers with a JSON-RPC error.
    runner.registry.get("scripted__echo").mcp_name = "vanished"
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "completed"
    assert "no tool vanished" in tool_messages(record)["e"]
    assert record.tool_stats["scripted__echo"].failure == 1


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        (("crash-init",), "missing configuration FOO"),
        (("hang-init",), "did not answer initialize"),
        (("no-tools",), "lists no tools"),
    ],
)
async def test_preflight_failure_is_one_line_naming_the_server(tmp_path, modes, expected):
    with pytest.raises(ConfigError) as caught:
        await mcp_runner(
            {"broken": scripted(*modes)}, local(tmp_path, False), ListModel([]), mcp_start_timeout_s=2
        )
    message = str(caught.value)
    assert "'broken'" in message and expected in message and "\n" not in message
    assert_none_inside(tmp_path)


async def test_missing_program_fails_preflight(tmp_path):
    with pytest.raises(ConfigError, match=r"'nope'.*not found"):
        await mcp_runner({"nope": {"command": "no-such-mcp-server"}}, local(tmp_path, False), ListModel([]))


async def test_row_servers_are_started_before_the_first_call_and_offered(tmp_path):
    model = ListModel([turn(call("mine__echo", {"text": "from the row"}, "e")), DONE])
    runner = await mcp_runner({}, local(tmp_path, False), model)
    record = await runner.run(sample(["terminal"], mcp_servers={"mine": scripted()}))
    assert record.exit_status == "completed", record.error
    assert "mine__echo" in {t["function"]["name"] for t in model.seen_tools[0]}
    assert tool_messages(record)["e"] == "from the row"
    assert record.toolsets_used == ["terminal", "mine"] and record.mcp_servers[0]["name"] == "mine"
    assert_none_inside(tmp_path)


async def test_secret_values_reach_the_server_but_not_the_record(tmp_path):
    token = "tok-" + "9" * 20
    server = {
        "command": "sh",
        "args": ["-c", f"echo $TOKEN >&2; exec {scripted()['command']} {scripted()['args'][0]}"],
    }
    server["env"] = {"TOKEN": "${MCP_TEST_TOKEN}"}
    model = ListModel([turn(call("s__echo", {"text": token}, "e")), DONE])
    runner = await mcp_runner({"s": server}, local(tmp_path, False), model, values={"MCP_TEST_TOKEN": token})
    record = await runner.run(sample(["s"]))
    assert record.exit_status == "completed", record.error
    assert token not in record.model_dump_json()  # the echo of it was scrubbed from the record


async def test_session_timeout_mid_call_stops_the_server_and_its_children(tmp_path):
    model = ListModel([turn(call("scripted__pid", {}, "p")), turn(call("scripted__hang", {}, "h")), DONE])
    runner = await mcp_runner({"scripted": scripted("child")}, local(tmp_path, False), model)
    runner.cfg = runner.cfg.model_copy(update={"session_timeout_s": 3.0})
    record = await runner.run(sample(["scripted"]))
    assert record.exit_status == "error:session_timeout"
    assert json.loads(tool_messages(record)["p"])["child"]  # the server had started a child
    assert_none_inside(tmp_path)  # the cancelled session still stopped the server and the child
