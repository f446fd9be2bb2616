"""Sort a session into ``kept``, ``rejected`` (with a reason) or ``failed`` (with the failure kind).

Order (the first match decides, so each session has exactly one reason):

1. ``failed``: ``exit_status`` is ``error:<kind>`` (always; not a filter). The reason is the kind.
2. ``rejected`` / ``unsafe_action``: a tool call was labelled by the unsafe-action rule set
   (``safety_labels``; enabled by ``FilterConfig.unsafe_actions``, off by default).
3. ``rejected`` / ``hallucinated_tool``: the model called a tool that was not offered
   (``hallucinated_calls > 0``; enabled by ``FilterConfig.hallucinated_tools``).
4. ``rejected`` / ``truncated``: a reply was cut at the token limit (``exit_status`` ``truncated``;
   ``FilterConfig.truncated``, on by default: a cut reply is not an answer to train on). Before
   ``no_reasoning``: a reply cut short often lost its reasoning too, and the cut is the cause.
5. ``rejected`` / ``no_reasoning``: no assistant turn carried reasoning (``FilterConfig.no_reasoning``).
6. ``rejected`` / ``incomplete``: the session did not complete, e.g. hit ``max_turns``
   (``FilterConfig.incomplete``).
7. ``rejected`` / ``low_reward``: no reward, or one below ``FilterConfig.min_reward``.
8. ``kept``.

Then, over each prompt group (``raygen.output.groups``, needs every sample's outcome):
``incomplete_group`` / ``uniform_group`` (``FilterConfig.groups``), then ``not_best``
(``FilterConfig.best_of``).
"""

from __future__ import annotations

from raygen.config import FilterConfig
from raygen.errors import failure_kind
from raygen.output.summary import SessionSummary

KEPT, REJECTED, FAILED = "kept", "rejected", "failed"
OUTCOMES = (KEPT, REJECTED, FAILED)
REJECTION_REASONS = (
    "unsafe_action",
    "hallucinated_tool",
    "truncated",
    "no_reasoning",
    "incomplete",
    "low_reward",
    "incomplete_group",
    "uniform_group",
    "not_best",
)
"""In the order they are checked."""


def classify(summary: SessionSummary, filters: FilterConfig) -> tuple[str, str | None]:
    """``("failed", kind)``, ``("rejected", reason)`` or ``("kept", None)``; see the module docstring."""
    if summary.failed:
        return FAILED, failure_kind(summary.exit_status)
    if filters.unsafe_actions and summary.safety_labels:
        return REJECTED, "unsafe_action"
    if filters.hallucinated_tools and summary.hallucinated_calls > 0:
        return REJECTED, "hallucinated_tool"
    if filters.truncated and summary.exit_status == "truncated":
        return REJECTED, "truncated"
    if filters.no_reasoning and summary.reasoning_with == 0:
        return REJECTED, "no_reasoning"
    if filters.incomplete and not summary.completed:
        return REJECTED, "incomplete"
    if filters.min_reward is not None and (summary.reward is None or summary.reward < filters.min_reward):
        return REJECTED, "low_reward"
    return KEPT, None
