"""Merge filters over prompt groups: ``--groups`` (complete, informative groups for RL) and ``--best-of``.

They run after the per-session filters (``raygen.output.filters.classify``), on the final record of
every sample, because they need the whole group. A sample without a ``group_id`` is a group of one.

- ``groups``: a group with a failed sample, or fewer samples than the largest group of the run (a sample
  that never ran), is incomplete: its kept samples get ``incomplete_group``. A complete group whose
  rewards are all equal carries no learning signal: ``uniform_group``.
- ``best_of``: of the group's samples still kept, the one with the highest reward stays (no reward
  ranks lowest; ties go to the lowest ``sample_index``, then the sample key); the others: ``not_best``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from raygen.config import FilterConfig

KEPT, REJECTED, FAILED = "kept", "rejected", "failed"


class GroupMember(Protocol):
    """What the merge keeps of each final record (``raygen.output.merge.FinalRecord``)."""

    key: str
    group_id: str | None
    sample_index: int
    reward: float | None
    outcome: str
    reason: str | None


def apply_group_filters(finals: Iterable[GroupMember], filters: FilterConfig) -> None:
    """Re-label kept members of groups that fail ``filters.groups`` / ``filters.best_of`` (in place)."""
    if not (filters.groups or filters.best_of):
        return
    groups: dict[str, list[GroupMember]] = {}
    for member in finals:
        groups.setdefault(member.group_id or member.key, []).append(member)
    size = max((m.sample_index + 1 for members in groups.values() for m in members), default=0)
    for members in groups.values():
        if filters.groups:
            _filter_group(members, size)
        if filters.best_of:
            _keep_best(members)


def _reject(members: Iterable[GroupMember], reason: str) -> None:
    for member in members:
        if member.outcome == KEPT:
            member.outcome, member.reason = REJECTED, reason


def _filter_group(members: list[GroupMember], size: int) -> None:
    if len(members) < size or any(m.outcome == FAILED for m in members):
        _reject(members, "incomplete_group")
    elif len({m.reward for m in members}) == 1:
        _reject(members, "uniform_group")


def _keep_best(members: list[GroupMember]) -> None:
    kept = [m for m in members if m.outcome == KEPT]
    if len(kept) < 2:
        return
    best = min(kept, key=lambda m: (-(m.reward if m.reward is not None else -1.0), m.sample_index, m.key))
    _reject((m for m in kept if m is not best), "not_best")
