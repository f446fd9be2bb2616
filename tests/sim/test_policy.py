"""The scripted policy: the script per tool combination, verification, plans and reasoning styles."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable

import pytest

from raygen.config import SimConfig
from raygen.model.sim_policy import is_slow, plan_for, respond

VERIFY_RE = re.compile(r"RAYGEN-VERIFY terminal=(ok|fail|skip) file=(ok|fail|skip)")


def tool(name: str) -> dict:
    params = {"type": "object", "properties": {"x": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": f"the {name} tool", "parameters": params},
    }


class World:
    """A client's tool side: a real shell for ``terminal``, an in-memory file system for the file tools."""

    def __init__(self, real_shell: bool = True, lose_writes: bool = False):
        self.files: dict[str, str] = {}
        self.real_shell, self.lose_writes = real_shell, lose_writes
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, name: str, args: dict) -> str:
        self.calls.append((name, args))
        if name == "terminal":
            if not self.real_shell:  # a broken client that echoes instead of executing
                return json.dumps({"exit_code": 0, "output": args["command"]})
            done = subprocess.run(["sh", "-c", args["command"]], capture_output=True, text=True, timeout=5)
            return json.dumps({"exit_code": done.returncode, "output": done.stdout})
        if name == "write_file":
            if not self.lose_writes:
                self.files[args["path"]] = args["content"]
            return json.dumps({"ok": True, "path": args["path"]})
        if name == "read_file":
            if args["path"] in self.files:
                return json.dumps({"content": self.files[args["path"]]})
            return json.dumps({"error": f"no such file: {args['path']}"})
        return json.dumps({"error": f"unknown tool {name!r}"})


def drive(
    prompt: str,
    offered: list[str],
    cfg: SimConfig,
    execute: Callable[[str, dict], str],
    strip_reasoning: bool = False,
    max_turns: int = 10,
) -> tuple[list[dict], list]:
    """Run a whole session against the policy like an agent loop; return (messages, replies)."""
    messages: list[dict] = [{"role": "system", "content": "be useful"}, {"role": "user", "content": prompt}]
    tools = [tool(n) for n in offered]
    replies = []
    for _ in range(max_turns):
        reply = respond({"model": "m", "messages": messages, "tools": tools}, cfg)
        replies.append(reply)
        msg = dict(reply.message)
        if strip_reasoning:
            msg.pop("reasoning_content", None)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return messages, replies
        for tc in msg["tool_calls"]:
            result = execute(tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
    raise AssertionError("the script did not finish")


def verdict(messages: list[dict]) -> tuple[str, str]:
    match = VERIFY_RE.search(messages[-1]["content"])
    assert match, messages[-1]
    return match.group(1), match.group(2)


BASE = SimConfig(seed=1)


def test_terminal_and_files_run_in_parallel_then_read_back():
    world = World()
    messages, replies = drive("list the files", ["terminal", "write_file", "read_file"], BASE, world)
    first = replies[0].message["tool_calls"]
    assert [tc["function"]["name"] for tc in first] == ["terminal", "write_file"]  # one message, parallel
    assert replies[0].finish_reason == "tool_calls"
    assert [tc["function"]["name"] for tc in replies[1].message["tool_calls"]] == ["read_file"]
    assert replies[-1].finish_reason == "stop" and len(replies) == 3
    assert verdict(messages) == ("ok", "ok")
    assert replies[-1].decision["verify"] == {"terminal": "ok", "file": "ok"}


def test_terminal_output_needs_a_real_shell():
    nonce = plan_for("check the shell", BASE).nonce
    world = World()
    drive("check the shell", ["terminal"], BASE, world)
    (_name, args), *_ = world.calls
    shell = subprocess.run(["sh", "-c", args["command"]], capture_output=True, text=True, timeout=5)
    assert shell.stdout.strip() == f"raygen-{nonce}-42"
    assert f"raygen-{nonce}-42" not in args["command"]  # the command itself does not contain the answer


@pytest.mark.parametrize(
    ("offered", "expected", "used"),
    [
        (["terminal"], ("ok", "skip"), {"terminal"}),
        (["write_file", "read_file"], ("skip", "ok"), {"write_file", "read_file"}),
        (["write_file"], ("skip", "skip"), set()),  # a write that cannot be read back proves nothing
        (["read_file", "search_files"], ("skip", "skip"), set()),
        ([], ("skip", "skip"), set()),
    ],
)
def test_each_tool_combination(offered, expected, used):
    world = World()
    messages, _replies = drive("do the task", offered, BASE, world)
    assert verdict(messages) == expected
    assert {name for name, _ in world.calls} == used
    assert all(name in offered for name, _ in world.calls)


def test_no_tools_answers_directly():
    _messages, replies = drive("hello there", [], BASE, World())
    assert len(replies) == 1 and replies[0].finish_reason == "stop"
    assert "tool_calls" not in replies[0].message


def test_wrong_tool_results_give_fail():
    messages, _ = drive("x", ["terminal", "write_file", "read_file"], BASE, World(False, lose_writes=True))
    assert verdict(messages) == ("fail", "fail")


def test_results_are_matched_by_call_id():
    """A correct output answering some other call does not count."""
    cfg = BASE
    world = World()
    messages, _ = drive("ids", ["terminal"], cfg, world)
    good = messages[-2]["content"]
    messages = messages[:-1]
    messages[-1] = {**messages[-1], "tool_call_id": "call_other"}
    messages.append({"role": "tool", "tool_call_id": "call_other2", "content": good})
    final = respond({"messages": messages, "tools": [tool("terminal")]}, cfg)
    assert final.decision["verify"]["terminal"] == "fail"


def test_hallucination_calls_an_unoffered_tool_then_continues():
    cfg = SimConfig(hallucinate_rate=1.0)
    offered = ["terminal", "write_file", "read_file", "web_search", "browse_web", "search_internet"]
    world = World()
    messages, replies = drive("news today", offered, cfg, world)
    first_calls = replies[0].message["tool_calls"]
    assert len(first_calls) == 1 and first_calls[0]["function"]["name"] not in offered
    assert replies[0].decision["hallucinate"] is True
    # The error result of the unknown tool does not derail the rest of the script.
    assert verdict(messages) == ("ok", "ok")
    # hallucinate, probe, read back, final answer: the offered web tools are no MCP tools, so not explored
    assert len(replies) == 4
    assert "tool_calls" not in replies[3].message


def test_only_mcp_tools_are_explored():
    """A harness's own tools (Claude Code's Task, Hermes's browser) are never called with made-up
    arguments; MCP tools (``server__tool``, Claude Code's ``mcp__server__tool``) are, once each."""
    offered = [
        "terminal",
        "read_file",
        "write_file",
        "Task",
        "browse_web",
        "time__now",
        "mcp__git__git_status",
    ]
    _, replies = drive("what changed", offered, SimConfig(hallucinate_rate=0.0), World())
    explored = [
        call["function"]["name"]
        for reply in replies
        for call in reply.message.get("tool_calls") or ()
        if call["function"]["name"] not in ("terminal", "read_file", "write_file")
    ]
    assert explored == ["time__now", "mcp__git__git_status"]


def test_hallucination_also_happens_without_offered_tools():
    _, replies = drive("q", [], SimConfig(hallucinate_rate=1.0), World())
    assert replies[0].message["tool_calls"][0]["function"]["name"] == "web_search"
    assert replies[-1].finish_reason == "stop"


def test_plan_rates_follow_config():
    cfg = SimConfig(hallucinate_rate=0.3, no_reasoning_rate=0.2, reasoning_style="mixed", seed=7)
    plans = [plan_for(f"prompt number {i}", cfg) for i in range(2000)]
    assert 0.25 < sum(p.hallucinate for p in plans) / 2000 < 0.35
    assert 0.15 < sum(not p.reason for p in plans) / 2000 < 0.25
    assert 0.42 < sum(p.reasoning_style == "field" for p in plans) / 2000 < 0.58
    assert len({p.nonce for p in plans}) > 1990
    assert all(re.fullmatch(r"[0-9a-f]{8}", p.nonce) for p in plans)


def test_plan_extremes_and_determinism():
    always = SimConfig(hallucinate_rate=1.0, no_reasoning_rate=1.0, reasoning_style="think")
    never = SimConfig(hallucinate_rate=0.0, no_reasoning_rate=0.0, reasoning_style="field")
    for i in range(200):
        a, n = plan_for(str(i), always), plan_for(str(i), never)
        assert a.hallucinate and not a.reason and a.reasoning_style == "think"
        assert not n.hallucinate and n.reason and n.reasoning_style == "field"
    assert plan_for("same", BASE) == plan_for("same", SimConfig(seed=1))
    assert plan_for("same", BASE).nonce != plan_for("same", SimConfig(seed=2)).nonce


def test_plan_matches_what_the_session_does():
    cfg = SimConfig(hallucinate_rate=0.5, no_reasoning_rate=0.5, seed=3)
    for i in range(40):
        prompt = f"task {i}"
        plan = plan_for(prompt, cfg)
        _, replies = drive(prompt, ["terminal"], cfg, World(real_shell=False))
        hallucinated = any(
            tc["function"]["name"] != "terminal" for r in replies for tc in r.message.get("tool_calls", ())
        )
        assert hallucinated == plan.hallucinate
        for r in replies:
            carries = "reasoning_content" in r.message or "<think>" in (r.message["content"] or "")
            assert carries == plan.reason


@pytest.mark.parametrize("style", ["field", "think"])
def test_reasoning_styles_on_every_turn(style):
    cfg = SimConfig(reasoning_style=style)
    messages, replies = drive("reason please", ["terminal", "write_file", "read_file"], cfg, World())
    for r in replies:
        msg = r.message
        if style == "field":
            assert msg["reasoning_content"] and "<think>" not in (msg["content"] or "")
        else:
            assert msg["content"].startswith("<think>") and "</think>" in msg["content"]
            assert "reasoning_content" not in msg
    assert verdict(messages) == ("ok", "ok")


def test_no_reasoning_anywhere_when_plan_says_so():
    cfg = SimConfig(no_reasoning_rate=1.0)
    _, replies = drive("quiet", ["terminal", "write_file", "read_file"], cfg, World())
    for r in replies:
        assert "reasoning_content" not in r.message
        assert "<think>" not in (r.message["content"] or "")
        assert r.decision["reasoning_passback"] is None


@pytest.mark.parametrize("style", ["field", "think"])
def test_reasoning_passback_is_recorded(style):
    cfg = SimConfig(reasoning_style=style)
    offered = ["terminal", "write_file", "read_file"]
    _, kept = drive("p", offered, cfg, World())
    assert kept[0].decision["reasoning_passback"] is None  # nothing to pass back on turn 1
    assert all(r.decision["reasoning_passback"] is True for r in kept[1:])
    if style == "field":
        _, stripped = drive("p", offered, cfg, World(), strip_reasoning=True)
        assert all(r.decision["reasoning_passback"] is False for r in stripped[1:])


def test_call_ids_and_arguments_are_well_formed():
    _, replies = drive(
        "ids", ["terminal", "write_file", "read_file"], SimConfig(hallucinate_rate=1.0), World()
    )
    ids = [tc["id"] for r in replies for tc in r.message.get("tool_calls", ())]
    assert len(ids) == len(set(ids)) == 4
    for r in replies:
        for tc in r.message.get("tool_calls", ()):
            assert re.fullmatch(r"call_[0-9a-f]+", tc["id"]) and tc["type"] == "function"
            assert isinstance(json.loads(tc["function"]["arguments"]), dict)


def test_token_estimates_grow_with_text():
    short = respond({"messages": [{"role": "user", "content": "hi"}]}, BASE)
    long = respond({"messages": [{"role": "user", "content": "word " * 4000}]}, BASE)
    assert short.prompt_tokens >= 1 and short.completion_tokens >= 1
    assert long.prompt_tokens >= 4000 > short.prompt_tokens


def test_script_always_terminates_even_if_results_are_lost():
    cfg = SimConfig(hallucinate_rate=1.0)
    messages = [{"role": "user", "content": "loop?"}]
    tools = [tool(n) for n in ("terminal", "write_file", "read_file")]
    for _ in range(6):  # a client that never sends tool results back
        reply = respond({"messages": messages, "tools": tools}, cfg)
        messages.append(reply.message)
        if reply.finish_reason == "stop":
            break
    assert reply.finish_reason == "stop" and verdict(messages) == ("fail", "fail")


def test_content_parts_are_read_as_text():
    parts = [{"type": "text", "text": "multi"}, {"type": "text", "text": "part"}]
    as_parts = respond({"messages": [{"role": "user", "content": parts}]}, BASE)
    as_text = respond({"messages": [{"role": "user", "content": "multipart"}]}, BASE)
    assert as_parts.decision["nonce"] == as_text.decision["nonce"] == plan_for("multipart", BASE).nonce


def test_stragglers_are_chosen_per_prompt_at_about_slow_rate():
    prompts = [f"Task {i}: list the files." for i in range(2000)]
    cfg = SimConfig(slow_rate=0.1)
    slow = [p for p in prompts if is_slow(p, cfg)]
    assert 150 < len(slow) < 250  # ~10%
    assert slow == [p for p in prompts if is_slow(p, SimConfig(slow_rate=0.1))]  # the same every time
    assert not any(is_slow(p, SimConfig()) for p in prompts)  # off by default
    assert set(slow) != {p for p in prompts if is_slow(p, SimConfig(slow_rate=0.1, seed=1))}  # seeded


def test_offered_tools_beyond_the_built_in_ones_are_explored_once_with_schema_arguments():
    from raygen.model.sim_policy import respond

    tools = [
        {"type": "function", "function": {"name": "terminal", "parameters": {}}},
        {
            "type": "function",
            "function": {
                "name": "time__convert_time",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "source_timezone": {"type": "string"},
                        "time": {"type": "string"},
                        "mode": {"type": "string", "enum": ["fast", "slow"]},
                        "count": {"type": "integer", "default": 3},
                        "verbose": {"type": "boolean"},
                    },
                    "required": ["source_timezone", "time", "mode", "count"],
                },
            },
        },
    ]
    messages = [{"role": "user", "content": "what time is it"}]
    cfg = SimConfig(hallucinate_rate=0.0)
    seen = []
    for _ in range(6):
        reply = respond({"messages": messages, "tools": tools}, cfg)
        messages.append(reply.message)
        for tc in reply.message.get("tool_calls") or ():
            seen.append((tc["function"]["name"], json.loads(tc["function"]["arguments"])))
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "ok"})
        if reply.finish_reason == "stop":
            break
    explored = [args for name, args in seen if name == "time__convert_time"]
    assert explored == [{"source_timezone": "Europe/Berlin", "time": "12:00", "mode": "fast", "count": 3}]
    assert reply.finish_reason == "stop"


def test_the_git_setup_never_touches_an_existing_repository(tmp_path):
    """The probe's git set-up (for an offered git server) makes a repository only where none is: a
    session that runs inside a checkout must not write or commit into it."""
    import subprocess

    from raygen.model.sim_explore import GIT_SETUP

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    subprocess.run(["bash", "-c", GIT_SETUP], cwd=fresh, check=True, capture_output=True)
    assert (fresh / "README.md").read_text() == "# sim\nmore\n"
    checkout = tmp_path / "checkout"
    (checkout / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / "README.md").write_text("the project's own\n")
    for where in (checkout, checkout / "sub"):
        subprocess.run(["bash", "-c", GIT_SETUP], cwd=where, check=True, capture_output=True)
    assert (checkout / "README.md").read_text() == "the project's own\n"
    assert not (checkout / "sub" / "README.md").exists()
    assert "sim" not in (checkout / ".git" / "config").read_text()
