"""The record of one session (``raygen.session.agent``), whichever agent ran it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from raygen.formats.limits import capped_record
from raygen.formats.loss_mask import loss_mask
from raygen.formats.records import Timing, Trajectory
from raygen.formats.sharegpt import to_sharegpt
from raygen.safety import rules_version


def build_record(state: Any) -> Trajectory:
    """The record of a ``raygen.session.agent._SessionState`` (scrubbed, capped)."""
    ended = time.time()
    row = state.sample.row
    record = Trajectory(
        id=state.sample.record_id,
        sample_key=state.sample.sample_key,
        prompt_index=state.sample.prompt_index,
        attempt=state.sample.attempt,
        category=row.category,
        metadata=dict(row.metadata),
        conversations=to_sharegpt(state.messages, state.schemas, state.tools_block),
        messages=state.messages,
        completed=state.completed,
        exit_status=state.exit_status,
        error=state.error,
        api_calls=state.api_calls,
        toolsets_used=state.toolsets_used,
        mcp_servers=state.mcp.records() if state.mcp is not None else [],
        tools_offered=sorted(state.offered),
        tool_stats=state.tool_stats,
        tool_error_counts=state.tool_errors,
        hallucinated_tools=state.hallucinated,
        reasoning=state.reasoning,
        usage=state.usage,
        cost_usd=state.spend.usd,
        cost_source=state.spend.source,
        timing=Timing(
            started_at=_iso(state.started),
            ended_at=_iso(ended),
            duration_s=round(ended - state.started, 4),
            model_s=round(state.model_s, 4),
            tools_s=round(state.tools_s, 4),
            env_setup_s=round(state.env_s, 4),
        ),
        model=state.runner.model.name,
        env=state.env_info,
        config_fingerprint=state.runner.config_fingerprint,
        safety_labels=state.safety_labels,
        safety_rules_version=rules_version(),
        group_id=state.sample.group_id,
        sample_index=state.sample.sample_index,
        reward=state.reward,
        verification=state.verification,
        artifacts=state.artifacts,
        turns=state.turns,
        loss_mask=loss_mask(state.messages, state.turns, state.first_generated),
        agent=state.agent_info,
        threads=state.threads,
    )
    scrubbed = state.scrubber.scrub_record(record)
    if scrubbed is not record:  # a secret was in the text: its tokens would still spell it
        scrubbed = scrubbed.without_token_ids()
    return capped_record(scrubbed, state.runner.cfg.max_record_bytes)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
