"""The fixed Parquet schema: independent of the records' content, faithful to them."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from raygen.formats.records import EnvInfo, ReasoningCounts, Timing, Trajectory, Usage
from raygen.output.schema import JSON_COLUMNS, SCHEMA, to_arrow_table


def full_record() -> dict:
    return Trajectory(
        id="row-1",
        sample_key="abc",
        prompt_index=3,
        attempt=2,
        category="数学",
        metadata={"source": "gsm", "nested": {"x": [1, 2]}},
        conversations=[{"from": "human", "value": "½ + ½ = ? 🚀"}, {"from": "gpt", "value": "1"}],
        messages=[
            {"role": "user", "content": "½ + ½ = ? 🚀"},
            {"role": "assistant", "content": "1", "reasoning_content": "easy"},
        ],
        completed=True,
        api_calls=1,
        toolsets_used=["math"],
        tools_offered=["calc"],
        tool_stats={"calc": {"count": 1, "success": 1, "failure": 0}},
        tool_error_counts={"hallucinated": 0},
        reasoning={"with_reasoning": 1},
        usage={"prompt_tokens": 12, "completion_tokens": 3},
        timing={"duration_s": 1.5, "started_at": "2025-01-01T00:00:00Z"},
        model="m",
        env={"backend": "local", "node": "n1"},
    ).model_dump(mode="json")


def sparse_record() -> dict:
    """Everything optional empty or null, and dicts with other keys."""
    return Trajectory(
        id="row-2",
        sample_key="def",
        prompt_index=0,
        metadata={"other": True},
        tool_stats={"terminal": {"count": 0}},
        exit_status="error:internal",
        error="boom",
    ).model_dump(mode="json")


def test_struct_fields_match_the_record_models():
    for name, model in (
        ("reasoning", ReasoningCounts),
        ("usage", Usage),
        ("timing", Timing),
        ("env", EnvInfo),
    ):
        struct = SCHEMA.field(name).type
        assert [struct.field(i).name for i in range(struct.num_fields)] == list(model.model_fields)
    # every record field has a column
    assert set(Trajectory.model_fields) <= set(SCHEMA.names)


def test_schema_does_not_depend_on_content():
    tables = [to_arrow_table([full_record()]), to_arrow_table([sparse_record()]), to_arrow_table([])]
    for table in tables:
        assert table.schema.equals(SCHEMA)
    for name in JSON_COLUMNS:
        assert SCHEMA.field(name).type == pa.string()
    assert SCHEMA.field("conversations").type == pa.list_(
        pa.struct([pa.field("from", pa.string()), pa.field("value", pa.string())])
    )
    assert tables[2].num_rows == 0


def test_rows_round_trip_through_parquet():
    records = [full_record(), sparse_record()]
    buf = io.BytesIO()
    pq.write_table(to_arrow_table(records), buf)
    rows = pq.read_table(io.BytesIO(buf.getvalue())).to_pylist()
    for row, record in zip(rows, records, strict=True):
        for name in JSON_COLUMNS:
            assert json.loads(row[name]) == record[name]
        assert row["conversations"] == record["conversations"]
        for name in ("id", "sample_key", "prompt_index", "attempt", "category", "exit_status", "error"):
            assert row[name] == record[name]
        for name in ("reasoning", "usage", "timing", "env"):
            assert row[name] == record[name]
    assert rows[0]["category"] == "数学" and rows[1]["category"] is None


def test_missing_fields_get_the_record_defaults():
    (row,) = to_arrow_table([{"sample_key": "k", "prompt_index": 5}]).to_pylist()
    defaults = Trajectory(id="k", sample_key="k", prompt_index=5).model_dump(mode="json")
    assert row["id"] == "k"
    assert row["timing"] == defaults["timing"] and row["env"] == defaults["env"]
    assert row["completed"] is defaults["completed"] and row["exit_status"] == defaults["exit_status"]
    assert json.loads(row["messages"]) == [] and json.loads(row["metadata"]) == {}
