"""The one Parquet schema of every ``data/train-*.parquet`` shard.

Why fixed: HuggingFace ``datasets`` refuses to load a set of Parquet files whose schemas differ, and
inferring a schema per shard makes them differ as soon as one shard lacks a value (e.g. every
``category`` null) or a dict has other keys. So scalars and fixed-shape structs are typed here, and the
free-form values whose keys vary from record to record are stored as JSON strings:

- ``messages``: raw OpenAI messages (optional keys such as ``tool_calls``, ``reasoning_content``);
- ``metadata``: whatever the prompts file carried;
- ``tool_stats``: keyed by tool name, and the known tools vary with the run's toolsets;
- ``tool_error_counts``: keyed by error kind;
- ``verification`` (null for rows without a check) and ``artifacts``: the verified-trajectory fields, kept
  as JSON so records of runs with and without checks share one schema;
- ``agent`` (null for raygen's own loop) and ``threads``: a harness run as the session (docs/agents.md).

Decode them with ``json.loads``. ``safety_labels`` has a fixed shape, so it is typed:
``list<struct<turn: int64, tool: string, label: string, rule_id: string>>`` (empty list for most rows);
so is ``turns`` (``TURN_INFO``, one per model call: finish reason, provider, model, and the token ids and
logprobs where captured), and ``loss_mask`` (``list<int8>``, one per message).
The JSONL output keeps the natural JSON (the Trajectory dump).
A test checks that the structs below match the pydantic models in ``raygen.formats.records``.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from raygen.formats.records import EnvInfo, ReasoningCounts, SafetyLabel, Timing, Usage

JSON_COLUMNS = (
    "messages",
    "metadata",
    "tool_stats",
    "tool_error_counts",
    "verification",
    "artifacts",
    "agent",
    "threads",
)
"""Columns holding a JSON string (decode with ``json.loads``)."""

_STRUCT_MODELS = {"reasoning": ReasoningCounts, "usage": Usage, "timing": Timing, "env": EnvInfo}
SAFETY_LABEL = pa.struct(
    [
        pa.field("turn", pa.int64()),
        pa.field("tool", pa.string()),
        pa.field("label", pa.string()),
        pa.field("rule_id", pa.string()),
    ]
)
"""One element of the ``safety_labels`` column (the fields of ``raygen.formats.records.SafetyLabel``)."""
TOP_LOGPROB = pa.struct([pa.field("token", pa.string()), pa.field("logprob", pa.float64())])
TURN_INFO = pa.struct(
    [
        pa.field("finish_reason", pa.string()),
        pa.field("provider", pa.string()),
        pa.field("model", pa.string()),
        pa.field("system_fingerprint", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int64())),
        pa.field("prompt_token_ids_from", pa.int64()),
        pa.field("token_ids", pa.list_(pa.int64())),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field("tokens", pa.list_(pa.string())),
        pa.field("top_logprobs", pa.list_(pa.list_(TOP_LOGPROB))),
    ]
)
"""One element of the ``turns`` column (the fields of ``raygen.formats.records.TurnInfo``; the token
lists are null where nothing was captured)."""

SCHEMA = pa.schema(
    [
        pa.field("format_version", pa.int64(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("sample_key", pa.string(), nullable=False),
        pa.field("prompt_index", pa.int64(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("category", pa.string()),
        pa.field("completed", pa.bool_(), nullable=False),
        pa.field("exit_status", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("api_calls", pa.int64(), nullable=False),
        pa.field("cost_usd", pa.float64(), nullable=False),
        pa.field("cost_source", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("config_fingerprint", pa.string(), nullable=False),
        pa.field(
            "conversations",
            pa.list_(pa.struct([pa.field("from", pa.string()), pa.field("value", pa.string())])),
        ),
        pa.field("messages", pa.string(), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("toolsets_used", pa.list_(pa.string())),
        pa.field("tools_offered", pa.list_(pa.string())),
        pa.field("mcp_servers", pa.string(), nullable=False),
        pa.field("hallucinated_tools", pa.list_(pa.string())),
        pa.field("tool_stats", pa.string(), nullable=False),
        pa.field("tool_error_counts", pa.string(), nullable=False),
        pa.field(
            "reasoning",
            pa.struct([pa.field("with_reasoning", pa.int64()), pa.field("without_reasoning", pa.int64())]),
        ),
        pa.field(
            "usage",
            pa.struct([pa.field("prompt_tokens", pa.int64()), pa.field("completion_tokens", pa.int64())]),
        ),
        pa.field(
            "timing",
            pa.struct(
                [
                    pa.field("started_at", pa.string()),
                    pa.field("ended_at", pa.string()),
                    pa.field("duration_s", pa.float64()),
                    pa.field("model_s", pa.float64()),
                    pa.field("tools_s", pa.float64()),
                    pa.field("env_setup_s", pa.float64()),
                ]
            ),
        ),
        pa.field(
            "env",
            pa.struct(
                [
                    pa.field("backend", pa.string()),
                    pa.field("image", pa.string()),
                    pa.field("node", pa.string()),
                ]
            ),
        ),
        pa.field("safety_labels", pa.list_(SAFETY_LABEL)),
        pa.field("safety_rules_version", pa.string(), nullable=False),
        pa.field("group_id", pa.string()),
        pa.field("sample_index", pa.int64(), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("verification", pa.string(), nullable=False),
        pa.field("artifacts", pa.string(), nullable=False),
        pa.field("turns", pa.list_(TURN_INFO)),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("agent", pa.string(), nullable=False),
        pa.field("threads", pa.string(), nullable=False),
    ]
)

_TEXT_COLUMNS = frozenset(
    {"error", "conversations", "messages", "metadata", "mcp_servers", "tool_stats", "tool_error_counts"}
    | {"verification", "artifacts", "turns", "loss_mask", "agent", "threads"}
)
"""Top-level columns of long or many-valued text or numbers (a trajectory's own content)."""


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """Parquet's dotted column paths of ``schema``'s leaves (``conversations.list.element.value``)."""
    paths: list[str] = []

    def walk(path: str, type_: pa.DataType) -> None:
        if pa.types.is_struct(type_):
            for child in type_:
                walk(f"{path}.{child.name}", child.type)
        elif pa.types.is_list(type_):
            walk(f"{path}.list.element", type_.value_type)
        else:
            paths.append(path)

    for field in schema:
        walk(field.name, field.type)
    return paths


PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    # No dictionary pages: zstd compresses the few-valued columns as well, and for the long text ones
    # the writer built a dictionary only to drop it (-20% of the merge's Parquet CPU, files ~10% smaller,
    # measured on 10,000 ceiling records).
    "use_dictionary": False,
    # Min/max statistics (for readers' filters) on the short columns only, not on trajectory text.
    "write_statistics": [p for p in _leaf_paths(SCHEMA) if p.split(".")[0] not in _TEXT_COLUMNS],
}
"""How ``data/`` Parquet files are written (the one-process and the parallel merge alike)."""

# Defaults for missing struct members come from the record models, so they cannot drift apart.
_STRUCT_DEFAULTS = {name: model().model_dump() for name, model in _STRUCT_MODELS.items()}


def _json(value: Any, default: Any) -> str:
    return json.dumps(default if value is None else value, ensure_ascii=False, separators=(",", ":"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _json(value, "")


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value or ()]


def _struct(name: str, value: Any) -> dict[str, Any]:
    defaults = _STRUCT_DEFAULTS[name]
    value = value or {}
    return {k: value.get(k, d) for k, d in defaults.items()}


def to_row(record: dict[str, Any]) -> dict[str, Any]:
    """One record (Trajectory JSON dict) as a row of ``SCHEMA``; missing fields get their defaults."""
    sample_key = record["sample_key"]
    category, error = record.get("category"), record.get("error")
    return {
        "format_version": int(record.get("format_version", 1)),
        "id": str(record.get("id") or sample_key),
        "sample_key": sample_key,
        "prompt_index": int(record["prompt_index"]),
        "attempt": int(record.get("attempt", 1)),
        "category": None if category is None else str(category),
        "completed": bool(record.get("completed", False)),
        "exit_status": str(record.get("exit_status") or "completed"),
        "error": None if error is None else str(error),
        "api_calls": int(record.get("api_calls") or 0),
        "cost_usd": float(record.get("cost_usd") or 0.0),
        "cost_source": str(record.get("cost_source") or ""),
        "model": str(record.get("model") or ""),
        "config_fingerprint": str(record.get("config_fingerprint") or ""),
        "conversations": [
            {"from": str(turn.get("from", "")), "value": _text(turn.get("value", ""))}
            for turn in record.get("conversations") or ()
        ],
        "messages": _json(record.get("messages"), []),
        "metadata": _json(record.get("metadata"), {}),
        "toolsets_used": _strings(record.get("toolsets_used")),
        "tools_offered": _strings(record.get("tools_offered")),
        "mcp_servers": _json(record.get("mcp_servers"), []),
        "hallucinated_tools": _strings(record.get("hallucinated_tools")),
        "tool_stats": _json(record.get("tool_stats"), {}),
        "tool_error_counts": _json(record.get("tool_error_counts"), {}),
        **{name: _struct(name, record.get(name)) for name in _STRUCT_MODELS},
        "safety_labels": [_safety_label(item) for item in record.get("safety_labels") or ()],
        "safety_rules_version": str(record.get("safety_rules_version") or ""),
        "group_id": None if record.get("group_id") is None else str(record["group_id"]),
        "sample_index": int(record.get("sample_index") or 0),
        "reward": None if record.get("reward") is None else float(record["reward"]),
        # JSON ``null`` when the row had no check, so "not verified" stays apart from an empty result.
        "verification": json.dumps(record.get("verification"), ensure_ascii=False, separators=(",", ":")),
        "artifacts": _json(record.get("artifacts"), []),
        "turns": [_turn(item) for item in record.get("turns") or ()],
        "loss_mask": [int(bool(v)) for v in record.get("loss_mask") or ()],
        "agent": json.dumps(record.get("agent"), ensure_ascii=False, separators=(",", ":")),
        "threads": _json(record.get("threads"), []),
    }


_TURN_TEXT = ("finish_reason", "provider", "model", "system_fingerprint")
_TURN_LISTS = ("prompt_token_ids", "token_ids", "logprobs", "tokens", "top_logprobs")


def _turn(item: Any) -> dict[str, Any]:
    item = item if isinstance(item, dict) else {}
    row: dict[str, Any] = {k: None if item.get(k) is None else str(item[k]) for k in _TURN_TEXT}
    row.update((k, item.get(k) if isinstance(item.get(k), list) else None) for k in _TURN_LISTS)
    row["prompt_token_ids_from"] = int(item.get("prompt_token_ids_from") or 0)
    return row


_SAFETY_FIELDS = tuple(SafetyLabel.model_fields)


def _safety_label(item: Any) -> dict[str, Any]:
    item = item if isinstance(item, dict) else {}
    return {
        "turn": int(item.get("turn") or 0),
        **{k: str(item.get(k) or "") for k in _SAFETY_FIELDS if k != "turn"},
    }


def to_arrow_table(records: list[dict[str, Any]]) -> pa.Table:
    """Records (Trajectory JSON dicts) as a table with exactly ``SCHEMA`` (an empty list gives 0 rows)."""
    return pa.Table.from_pylist([to_row(r) for r in records], schema=SCHEMA)
