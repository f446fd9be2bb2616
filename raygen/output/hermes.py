"""Hermes-format output: records and statistics of Hermes Agent's ``batch_runner.py``, from raygen records.

``output.format: hermes`` (``--format hermes``) makes the merge also write ``RUN_DIR/trajectories.jsonl``
(the kept sessions) in the reference runner's shape, and add the reference's keys to ``statistics.json``,
so a pipeline that reads the reference's files reads raygen's unchanged. Everything is derived from the
stored raygen records (their lossless ``messages``), so ``raygen merge --format hermes`` re-emits it from
the shards with no model call. docs/migrating-from-hermes.md lists each field and each deliberate
difference; the ones decided here:

- ``tool_stats``/``tool_error_counts`` cover one fixed tool list for the whole run (``output.hermes_tools``,
  default: the reference's own tool names plus this run's), so every record has the same keys and
  ``datasets`` loads raygen's file together with the reference's. A call to a tool that was not offered is
  never counted as a success (the reference adds the invented name as a new, successful key); it shows in
  ``statistics.json``'s ``tool_statistics`` as a failure.
- A tool call fails when its result carries a non-null ``error`` (the reference's rule): a command that
  exited non-zero succeeded as a call (``exit_code`` says the rest), a timeout did not.
- The system turn is the function-calling preamble with the offered tools, followed by the system prompt
  the model was actually sent (the reference stores the preamble instead of what it sent). An ephemeral
  system prompt is never stored.
- ``metadata.timestamp`` is when the session ended, in UTC (the reference writes local time), in the
  reference's format; ``metadata.batch_num`` is the ``prompt_index`` (raygen has no batches: the
  reference's value with ``--batch_size=1``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from raygen.errors import ConfigError
from raygen.formats.limits import stored_arguments
from raygen.formats.reasoning import split_reasoning
from raygen.formats.sharegpt import dialogue_turns

FORMATS = ("raygen", "hermes")

# The reference's ``ALL_POSSIBLE_TOOLS`` (hermes-agent 0.19.0, MIT licence): the keys of every record's
# ``tool_stats`` and ``tool_error_counts`` in its output. Records with other keys make ``datasets`` refuse
# to load raygen's file together with the reference's (a struct's fields must match).
REFERENCE_TOOLS = (  # noqa: SIM905 - one name list, kept readable
    "browser_back browser_cdp browser_click browser_console browser_dialog browser_get_images "
    "browser_navigate browser_press browser_scroll browser_snapshot browser_type browser_vision clarify "
    "close_terminal computer_use cronjob delegate_task discord discord_admin execute_code feishu_doc_read "
    "feishu_drive_add_comment feishu_drive_list_comment_replies feishu_drive_list_comments "
    "feishu_drive_reply_comment ha_call_service ha_get_state ha_list_entities ha_list_services "
    "image_generate kanban_attach kanban_attach_url kanban_attachments kanban_block kanban_comment "
    "kanban_complete kanban_create kanban_heartbeat kanban_link kanban_list kanban_show kanban_unblock "
    "memory patch process project_create project_list project_switch read_file read_terminal search_files "
    "session_search skill_manage skill_view skills_list spotify_albums spotify_devices spotify_library "
    "spotify_playback spotify_playlists spotify_queue spotify_search terminal text_to_speech todo "
    "video_analyze video_generate vision_analyze web_extract web_search write_file x_search "
    "xai_video_edit xai_video_extend yb_query_group_info yb_query_group_members yb_search_sticker "
    "yb_send_dm yb_send_sticker"
).split()

# The reference's system turn: a function-calling preamble around the offered tools' schemas.
_PREAMBLE_HEAD = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> "
    "XML tags. You may call one or more functions to assist with the user query. If available tools are not "
    "relevant in assisting with user query, just respond in natural conversational language. Don't make "
    "assumptions about what values to plug into functions. After calling & executing the functions, you will "
    "be provided with function results within <tool_response> </tool_response> XML tags. Here are the "
    "available tools:\n"
)
_PREAMBLE_TAIL = (
    "For each function call return a JSON object, with the following pydantic model json schema for each:\n"
    "{'title': 'FunctionCall', 'type': 'object', 'properties': {'name': {'title': 'Name', 'type': 'string'}, "
    "'arguments': {'title': 'Arguments', 'type': 'object'}}, 'required': ['name', 'arguments']}\n"
    "Each function call should be enclosed within <tool_call> </tool_call> XML tags.\n"
    "Example:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>"
)
_EMPTY_THINK = "<think>\n</think>\n"
_TERMINAL = "terminal"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _json_or_text(text: Any) -> Any:
    if isinstance(text, str) and text.strip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def system_turn(schemas: list[dict[str, Any]], system_prompt: str | None) -> str:
    """The preamble with ``schemas`` (OpenAI ``function`` dicts) in the reference's tool layout, then the
    system prompt the model was sent, if any."""
    tools = [
        {
            "name": s.get("name"),
            "description": s.get("description", ""),
            "parameters": s.get("parameters", {}),
            "required": None,
        }
        for s in schemas
    ]
    text = f"{_PREAMBLE_HEAD}<tools>\n{_dumps(tools)}\n</tools>\n{_PREAMBLE_TAIL}"
    return f"{text}\n\n{system_prompt}" if system_prompt else text


def offered_schemas(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The offered tools' schemas, read back from the ``<tools>`` block that ends raygen's system turn."""
    turns = record.get("conversations") or []
    value = turns[0].get("value", "") if turns and turns[0].get("from") == "system" else ""
    start, end = value.rfind("<tools>\n"), value.rfind("\n</tools>")
    if start < 0 or end < start:
        return []
    try:
        schemas = json.loads(value[start + len("<tools>\n") : end])
    except ValueError:
        return []
    return [s for s in schemas if isinstance(s, dict)] if isinstance(schemas, list) else []


def assistant_turn(message: dict[str, Any]) -> str:
    """``<think>`` block (empty without reasoning), visible text, then one ``<tool_call>`` per call."""
    reasoning, visible = split_reasoning(message)
    text = f"<think>\n{reasoning}\n</think>\n" if reasoning else _EMPTY_THINK
    calls = message.get("tool_calls") or []
    if not calls:
        return (text + visible).strip()
    if visible:
        text += visible + "\n"
    for call in calls:
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        if isinstance(arguments, str):  # a huge argument is stored once, in messages (session/limits.py)
            arguments = stored_arguments(arguments)
        payload = {"name": fn.get("name"), "arguments": _json_or_text(arguments)}
        text += f"<tool_call>\n{_dumps(payload)}\n</tool_call>\n"
    return text.rstrip()


def tool_content(name: str, content: Any) -> Any:
    """A tool result in the reference's shape: JSON objects always carry ``error`` (null on success); a
    terminal result is ``{"output", "exit_code", "error"}`` with the output's trailing newlines dropped."""
    value = _json_or_text(content)
    if not isinstance(value, dict):
        return value
    if name == _TERMINAL and ("output" in value or set(value) == {"error"}):
        error = value.get("error")
        if error is None and value.get("timed_out"):
            error = "command timed out"
        shaped = {
            "output": str(value.get("output", "")).rstrip("\n"),
            "exit_code": value.get("exit_code", -1),
            "error": error,
        }
        shaped.update((k, v) for k, v in value.items() if k not in shaped)
        return shaped
    return {**value, "error": value.get("error")}


def _tool_payload(message: dict[str, Any]) -> dict[str, Any]:
    name = message.get("name") or ""
    return {
        "tool_call_id": message.get("tool_call_id", ""),
        "name": name,
        "content": tool_content(name, message.get("content")),
    }


def _call_failed(shaped: Any) -> bool:
    return isinstance(shaped, dict) and shaped.get("error") is not None


@dataclass
class HermesOptions:
    """What the Hermes output needs from the run's config."""

    run_name: str
    distribution: str
    model: str
    tools: list[str]
    """The fixed key list of ``tool_stats``/``tool_error_counts``."""


def hermes_options(config: Any, run_dir: Any, fmt: str | None = None) -> HermesOptions | None:
    """Options for ``config`` (a RunConfig), or None when the output format (``fmt`` overrides the
    config's) is raygen's own."""
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if (fmt or config.output.format) != "hermes":
        return None
    from raygen.tools.registry import load_registry

    tools = config.output.hermes_tools
    if tools is None:
        registered = set(load_registry(config.tools.plugins).all_tool_names()) | _manifest_tools(run_dir)
        tools = sorted(set(REFERENCE_TOOLS) | registered)
    return HermesOptions(run_dir.name, config.tools.distribution, config.model.model, list(tools))


def _manifest_tools(run_dir: Any) -> set[str]:
    """The tools the run offered by its manifest (MCP servers' tools are known only from there)."""
    try:
        manifest = run_dir.read_json("manifest.json")
    except (OSError, ValueError, AttributeError):
        return set()
    schemas = (manifest.get("generation") or {}).get("tool_schemas") or []
    return {str((s.get("function") or {}).get("name")) for s in schemas if isinstance(s, dict)}


def convert(record: dict[str, Any], tools: list[str]) -> tuple[dict[str, Any], Counter, list[str]]:
    """One raygen record as a reference record, its per-tool ``[success, failure]`` counts and the names
    of tools it called that were not offered."""
    messages = record.get("messages") or []
    system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
    turns = [{"from": "system", "value": system_turn(offered_schemas(record), system)}]
    turns += dialogue_turns(messages, assistant_turn, _tool_payload)
    offered = set(record.get("tools_offered") or [])
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in tools}
    invented: list[str] = []
    for message in messages:
        if message.get("role") != "tool":
            continue
        name = message.get("name") or ""
        if name not in offered:
            invented.append(name)
            continue
        stat = stats.setdefault(name, {"count": 0, "success": 0, "failure": 0})
        stat["count"] += 1
        stat["failure" if _call_failed(tool_content(name, message.get("content"))) else "success"] += 1
    hermes = {
        "prompt_index": int(record["prompt_index"]),
        "conversations": turns,
        "metadata": {
            "batch_num": int(record["prompt_index"]),
            "timestamp": _timestamp((record.get("timing") or {}).get("ended_at")),
            "model": str(record.get("model") or ""),
        },
        "completed": bool(record.get("completed")),
        # Every kept session that did not end with a final answer (max_turns, truncated) is partial.
        "partial": not record.get("completed"),
        "api_calls": int(record.get("api_calls") or 0),
        "toolsets_used": [str(t) for t in record.get("toolsets_used") or ()],
        "tool_stats": stats,
        "tool_error_counts": {name: s["failure"] for name, s in stats.items()},
    }
    return hermes, stats, invented


def _timestamp(iso: str | None) -> str:
    try:
        moment = datetime.fromisoformat(iso) if iso else datetime.now(UTC)
    except ValueError:
        moment = datetime.now(UTC)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat(timespec="microseconds")


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


@dataclass
class HermesWriter:
    """Fed every final record of a merge (in output order); writes the kept ones to ``path``."""

    options: HermesOptions
    path: Path
    tool_totals: dict[str, list[int]] = field(default_factory=dict)
    turns_with: int = 0
    turns_without: int = 0
    first_start: float | None = None
    last_end: float | None = None
    written: int = 0

    def __post_init__(self) -> None:
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()

    def add(self, record: dict[str, Any], kept: bool, failed: bool) -> None:
        timing = record.get("timing") or {}
        for bound, pick in ((_epoch(timing.get("started_at")), min), (_epoch(timing.get("ended_at")), max)):
            if bound is not None:
                attr = "first_start" if pick is min else "last_end"
                current = getattr(self, attr)
                setattr(self, attr, bound if current is None else pick(current, bound))
        if failed:  # like the reference, statistics cover the sessions that ran to an end
            return
        hermes, stats, invented = convert(record, self.options.tools)
        for name, stat in stats.items():
            if stat["count"]:
                self._tally(name, stat["success"], stat["failure"])
        for name in invented:
            self._tally(name or "(unnamed)", 0, 1)
        reasoning = record.get("reasoning") or {}
        self.turns_with += int(reasoning.get("with_reasoning") or 0)
        self.turns_without += int(reasoning.get("without_reasoning") or 0)
        if kept:
            self._file.write(_dumps(hermes).encode("utf-8") + b"\n")
            self.written += 1

    def _tally(self, name: str, success: int, failure: int) -> None:
        sums = self.tool_totals.setdefault(name, [0, 0, 0])
        sums[0] += success + failure
        sums[1] += success
        sums[2] += failure

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abandon(self) -> None:
        """Drop the partial file of a merge that failed."""
        self._file.close()
        self.path.unlink(missing_ok=True)

    def statistics(self, total_prompts: int) -> dict[str, Any]:
        """The reference's ``statistics.json`` keys (merged into raygen's, which share none of them)."""
        tools = {}
        for name, (count, success, failure) in sorted(self.tool_totals.items()):
            calls = success + failure
            tools[name] = {
                "count": count,
                "success": success,
                "failure": failure,
                "success_rate": round(success / calls * 100, 2) if calls else 0.0,
                "failure_rate": round(failure / calls * 100, 2) if calls else 0.0,
            }
        span = (self.last_end - self.first_start) if self.first_start and self.last_end else 0.0
        return {
            "run_name": self.options.run_name,
            "distribution": self.options.distribution,
            "total_prompts": total_prompts,
            "total_batches": total_prompts,
            "batch_size": 1,
            "model": self.options.model,
            "completed_at": _timestamp(None),
            "duration_seconds": round(max(span, 0.0), 2),
            "tool_statistics": tools,
            "reasoning_statistics": {
                "total_assistant_turns": self.turns_with + self.turns_without,
                "turns_with_reasoning": self.turns_with,
                "turns_without_reasoning": self.turns_without,
            },
        }
