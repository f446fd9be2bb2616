"""The simulator's scripted agent: a pure, deterministic function from a chat request to one reply.

The policy is stateless: every decision is derived from the request itself. Per-session choices
(hallucinate? reason? which reasoning style?) come from ``plan_for`` on the first user message, so
the same prompt behaves the same way on every turn, in every process and on every run with the same
seed. The step within the session is inferred from the tool calls already in the conversation.

The script proves that the client really executed the tools: the terminal call prints a string that
only a real shell produces (``$((6*7))`` expands to 42), and the file check writes a token and reads
it back. The final answer states the outcome on a machine-checkable line::

    RAYGEN-VERIFY terminal=ok|fail|skip file=ok|fail|skip
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from raygen.model.configs import SimConfig
from raygen.model.sim_coding import coding_step
from raygen.model.sim_explore import exploration_calls, setup_prefix

NONEXISTENT_MODEL_PREFIX = "nonexistent"
"""Model names starting with this are unknown to the simulator (HTTP 404; for failure-path tests)."""

VERIFY_MARKER = "RAYGEN-VERIFY"
SCRIPT_MAX_TURNS = 5
"""hallucinate, probe, read back, explore (raygen.model.sim_explore), final answer: the script never needs
more assistant turns, so any conversation that already has this many gets the final answer (guarantees
termination)."""

_HALLUCINATED_NAMES = ("web_search", "browse_web", "search_internet")
SHELL_TOOLS = {"terminal": "command", "bash": "command", "Bash": "command", "exec_command": "cmd"}
"""Shell tools and the argument holding the command: raygen's and Hermes Agent's ``terminal``,
mini-swe-agent's ``bash``, Claude Code's ``Bash``, Codex's ``exec_command``."""
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent ends a task when a command prints this; a harness whose prompt asks for it gets it as
the final answer's tool call (a reply without a tool call would be a format error there)."""


def is_nonexistent_model(model: str) -> bool:
    """True for model names the simulator pretends not to know."""
    return model.startswith(NONEXISTENT_MODEL_PREFIX)


@dataclass(frozen=True)
class Plan:
    """Per-session decisions, derived from the seed and the first user message only."""

    hallucinate: bool
    """The session's first turn calls a tool that was not offered."""
    reason: bool
    """Every assistant turn carries reasoning (otherwise none does)."""
    reasoning_style: str
    """``field`` (``reasoning_content``) or ``think`` (``<think>...</think>`` at the start of content)."""
    nonce: str
    """8 hex characters that make the session's tool outputs unique and checkable."""

    @property
    def terminal_token(self) -> str:
        """What the terminal probe prints when a real shell runs it."""
        return f"raygen-{self.nonce}-42"

    @property
    def check_path(self) -> str:
        return f"raygen_check_{self.nonce}.txt"

    @property
    def file_token(self) -> str:
        # Not just the nonce: an error like "no such file raygen_check_<nonce>.txt" must not pass the check.
        return f"raygen-file-{self.nonce}"


@dataclass
class PolicyReply:
    """One assistant reply in OpenAI format, with token estimates and the decision taken (for logs)."""

    message: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    decision: dict[str, Any] = field(default_factory=dict)


def _unit(digest: bytes, index: int) -> float:
    """The ``index``-th uniform float in [0, 1) drawn from a digest (4 bytes each)."""
    return int.from_bytes(digest[4 * index : 4 * index + 4], "big") / 2**32


def plan_for(prompt_text: str, cfg: SimConfig) -> Plan:
    """The session plan for a prompt (the content of the first user message) under ``cfg``."""
    digest = hashlib.sha256(f"{cfg.seed}:{prompt_text}".encode()).digest()
    style = cfg.reasoning_style
    if style == "mixed":
        style = "field" if _unit(digest, 2) < 0.5 else "think"
    return Plan(
        hallucinate=_unit(digest, 0) < cfg.hallucinate_rate,
        reason=not _unit(digest, 1) < cfg.no_reasoning_rate,
        reasoning_style=style,
        nonce=digest[12:16].hex(),
    )


def is_slow(prompt_text: str, cfg: SimConfig) -> bool:
    """Whether a prompt's session is a straggler (``sim.slow_rate``): every request of it takes
    ``sim.slow_factor`` times the latency. Decided per prompt like the plan, so tests can tell which."""
    digest = hashlib.sha256(f"{cfg.seed}:slow:{prompt_text}".encode()).digest()
    return _unit(digest, 0) < cfg.slow_rate


def message_text(content: object) -> str:
    """Text of a message ``content``: a string, a list of content parts, or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def first_user_text(messages: list[dict[str, Any]]) -> str:
    """Content of the first user message ("" if there is none): the key of the session plan."""
    for m in messages:
        if m.get("role") == "user":
            return message_text(m.get("content"))
    return ""


def count_assistant_turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def has_reasoning(message: dict[str, Any]) -> bool:
    """Whether an assistant message carries reasoning in either style (or OpenRouter's ``reasoning``)."""
    if message.get("reasoning_content") or message.get("reasoning"):
        return True
    return "<think>" in message_text(message.get("content"))


@dataclass
class _History:
    """What the conversation so far tells about the script's progress."""

    assistant: list[dict[str, Any]]
    calls: list[tuple[str, str, dict[str, Any]]]
    """(tool name, call id, parsed arguments) of every tool call made so far."""
    results: dict[str, str]
    """tool_call_id -> text of the tool message answering it."""

    @classmethod
    def of(cls, messages: list[dict[str, Any]]) -> _History:
        assistant, calls, results = [], [], {}
        for m in messages:
            role = m.get("role")
            if role == "assistant":
                assistant.append(m)
                for tc in m.get("tool_calls") or ():
                    fn = tc.get("function") or {}
                    try:
                        args = json.loads(fn.get("arguments") or "{}")
                    except (TypeError, ValueError):
                        args = None
                    args = args if isinstance(args, dict) else {}
                    calls.append((fn.get("name", ""), tc.get("id", ""), args))
            elif role == "tool":
                results[m.get("tool_call_id", "")] = message_text(m.get("content"))
        return cls(assistant, calls, results)

    def called(self) -> set[str]:
        return {name for name, _, _ in self.calls}

    def any_result_contains(self, tool: str, token: str) -> bool:
        return any(name == tool and token in self.results.get(cid, "") for name, cid, _ in self.calls)


def offered_tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    names = set()
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            names.add(fn["name"])
    return names


def shell_tool(offered: set[str]) -> str | None:
    """The offered shell tool, if any (``SHELL_TOOLS``, in that order)."""
    return next((name for name in SHELL_TOOLS if name in offered), None)


def _probe_tools(offered: set[str]) -> list[str]:
    """Tools of the probe turn. The file check needs both write_file and read_file to mean anything."""
    shell = shell_tool(offered)
    probes = [shell] if shell else []
    if {"write_file", "read_file"} <= offered:
        probes.append("write_file")
    return probes


def _next_action(plan: Plan, offered: set[str], history: _History, tools: list[dict[str, Any]]) -> str:
    called = history.called()
    if len(history.assistant) >= SCRIPT_MAX_TURNS:
        return "final"
    if plan.hallucinate and not called - offered:
        return "hallucinate"
    probes = _probe_tools(offered)
    if probes and not called & set(probes):
        return "probe"
    if "write_file" in probes and "read_file" not in called:
        return "read"
    if exploration_calls(tools, called):
        return "explore"
    return "final"


def _hallucinated_name(offered: set[str], nonce: str) -> str:
    for name in _HALLUCINATED_NAMES:
        if name not in offered:
            return name
    return f"web_search_{nonce}"  # offered tools never carry the session's nonce


def _verify(plan: Plan, offered: set[str], history: _History) -> dict[str, str]:
    def outcome(offered_ok: bool, tool: str, token: str) -> str:
        if not offered_ok:
            return "skip"
        return "ok" if history.any_result_contains(tool, token) else "fail"

    shell = shell_tool(offered)
    return {
        "terminal": outcome(shell is not None, shell or "", plan.terminal_token),
        "file": outcome("write_file" in _probe_tools(offered), "read_file", plan.file_token),
    }


def _calls_for(
    action: str, plan: Plan, offered: set[str], prompt: str, tools: list[dict[str, Any]], called: set[str]
) -> list[tuple[str, dict[str, Any]]]:
    if action == "explore":
        return exploration_calls(tools, called)
    if action == "hallucinate":
        return [(_hallucinated_name(offered, plan.nonce), {"query": prompt[:200]})]
    if action == "probe":
        calls = []
        if shell := shell_tool(offered):
            probe = f"printf 'raygen-%s-%d\\n' {plan.nonce} $((6*7))"
            calls.append((shell, {SHELL_TOOLS[shell]: setup_prefix(tools) + probe}))
        if "write_file" in _probe_tools(offered):
            calls.append(("write_file", {"path": plan.check_path, "content": plan.file_token}))
        return calls
    if action == "read":
        return [("read_file", {"path": plan.check_path})]
    return []


_REASONING = {
    "hallucinate": "This might need fresh information, so I will search the web before anything else.",
    "probe": "I will check the environment: compute 6*7 in the shell with printf and write a check file.",
    "read": "The check file should now exist; I will read it back and compare its content.",
    "explore": "There are more tools offered; I will try each of them once to see what they return.",
}


def _final_text(verify: dict[str, str], offered: set[str]) -> tuple[str, str]:
    line = f"{VERIFY_MARKER} terminal={verify['terminal']} file={verify['file']}"
    if not offered:
        return line + "\nNo tools were offered, so I answered directly.", "No tools; answer directly."
    summary = f"Checked the environment: terminal={verify['terminal']}, file={verify['file']}."
    return f"{line}\n{summary}", f"Summarising what the tool results showed. {summary}"


def _estimate_tokens(chars: int) -> int:
    return max(1, chars // 4)


def _prompt_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    chars = 0
    for m in messages:
        chars += len(message_text(m.get("content"))) + len(m.get("reasoning_content") or "")
        for tc in m.get("tool_calls") or ():
            chars += len((tc.get("function") or {}).get("arguments") or "")
    for t in tools or ():
        fn = t.get("function") or {}
        # The parameter schema is not serialised (cost per request); ~160 chars is a typical schema.
        chars += len(fn.get("name", "")) + len(fn.get("description") or "") + 160
    return chars


def _call_id(plan: Plan, turn: int, index: int) -> str:
    return "call_" + hashlib.sha256(f"{plan.nonce}:{turn}:{index}".encode()).hexdigest()[:24]


def respond(request: dict[str, Any], cfg: SimConfig) -> PolicyReply:
    """The scripted assistant's reply to a chat-completions request body."""
    messages = request.get("messages") or []
    tools = request.get("tools") or []
    prompt = first_user_text(messages)
    plan = plan_for(prompt, cfg)
    offered = offered_tool_names(tools)
    history = _History.of(messages)
    turn = len(history.assistant) + 1
    action = _next_action(plan, offered, history, tools)

    decision: dict[str, Any] = {
        "turn": turn,
        "action": action,
        "hallucinate": plan.hallucinate,
        "reason": plan.reason,
        "reasoning_style": plan.reasoning_style if plan.reason else None,
        "nonce": plan.nonce,
        "tools_offered": len(offered),
        # Did the client send earlier reasoning back? None when there is nothing it could have sent.
        "reasoning_passback": (
            all(has_reasoning(m) for m in history.assistant) if history.assistant and plan.reason else None
        ),
    }

    calls = _calls_for(action, plan, offered, prompt, tools, history.called())
    if action == "final":
        verify = _verify(plan, offered, history)
        decision["verify"] = verify
        visible, reasoning = _final_text(verify, offered)
        shell = shell_tool(offered)
        if shell and any(SUBMIT_COMMAND in message_text(m.get("content")) for m in messages[:2]):
            calls = [(shell, {SHELL_TOOLS[shell]: SUBMIT_COMMAND})]
    else:
        visible, reasoning = None, _REASONING[action]
    coding = coding_step(prompt, offered, [name for name, _, _ in history.calls], cfg, request.get("seed"))
    if coding is not None:  # a "write solution.py" task replaces the probe script (raygen.model.sim_coding)
        calls, visible, reasoning = coding.calls, coding.visible, coding.reasoning
        decision.update(coding.decision)

    message: dict[str, Any] = {"role": "assistant", "content": visible}
    if plan.reason and plan.reasoning_style == "field":
        message["reasoning_content"] = reasoning
    elif plan.reason:
        message["content"] = f"<think>{reasoning}</think>" + (f"\n{visible}" if visible else "")
    if calls:
        message["tool_calls"] = [
            {
                "id": _call_id(plan, turn, i),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(calls)
        ]

    completion_chars = len(message["content"] or "") + len(message.get("reasoning_content", ""))
    completion_chars += sum(len(tc["function"]["arguments"]) for tc in message.get("tool_calls", ()))
    reply = PolicyReply(
        message=message,
        prompt_tokens=_estimate_tokens(_prompt_chars(messages, tools)),
        completion_tokens=_estimate_tokens(completion_chars),
        finish_reason="tool_calls" if calls else "stop",
        decision=decision,
    )
    return _within_token_limit(reply, request.get("max_tokens") or request.get("max_completion_tokens"))


def _within_token_limit(reply: PolicyReply, max_tokens: object) -> PolicyReply:
    """A reply longer than the request's ``max_tokens`` is cut as providers cut it: the text stops at the
    limit, the tool calls are lost and ``finish_reason`` is ``length``."""
    if not isinstance(max_tokens, int) or reply.completion_tokens <= max_tokens:
        return reply
    message = reply.message
    text = (message.get("reasoning_content") or "") + (message.get("content") or "")
    for call in message.get("tool_calls") or ():
        text += json.dumps(call["function"])
    cut = {"role": "assistant", "content": text[: max(0, max_tokens) * 4]}
    decision = {**reply.decision, "truncated_at": max_tokens}
    return PolicyReply(cut, reply.prompt_tokens, max_tokens, "length", decision)
