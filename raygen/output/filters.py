"""Sort a session into ``kept``, ``rejected`` (with a reason) or ``failed`` (with the failure kind).

Order (the first match decides, so each session has exactly one reason):

1. ``failed``: ``exit_status`` is ``error:<kind>`` (always; not a filter). The reason is the kind.
2. ``rejected`` / ``unsafe_action``: a tool call was labelled by the unsafe-action rule set
   (``safety_labels``; enabled by ``FilterConfig.unsafe_actions``, off by default).
3. ``rejected`` / ``hallucinated_tool``: the model called a tool that was not offered
   (``hallucinated_calls > 0``; enabled by ``FilterConfig.hallucinated_tools``).
4. ``rejected`` / ``no_reasoning``: no assistant turn carried reasoning (``FilterConfig.no_reasoning``).
5. ``rejected`` / ``incomplete``: the session did not complete, e.g. hit ``max_turns``
   (``FilterConfig.incomplete``).
6. ``kept``.
"""

from __future__ import annotations

from raygen.config import FilterConfig
from raygen.errors import failure_kind
from raygen.output.summary import SessionSummary

KEPT, REJECTED, FAILED = "kept", "rejected", "failed"
OUTCOMES = (KEPT, REJECTED, FAILED)
REJECTION_REASONS = ("unsafe_action", "hallucinated_tool", "no_reasoning", "incomplete")
"""In the order they are checked."""


def classify(summary: SessionSummary, filters: FilterConfig) -> tuple[str, str | None]:
    """``("failed", kind)``, ``("rejected", reason)`` or ``("kept", None)``; see the module docstring."""
    if summary.failed:
        return FAILED, failure_kind(summary.exit_status)
    if filters.unsafe_actions and summary.safety_labels:
        return REJECTED, "unsafe_action"
    if filters.hallucinated_tools and summary.hallucinated_calls > 0:
        return REJECTED, "hallucinated_tool"
    if filters.no_reasoning and summary.reasoning_with == 0:
        return REJECTED, "no_reasoning"
    if filters.incomplete and not summary.completed:
        return REJECTED, "incomplete"
    return KEPT, None
