"""What a run folder already holds: the outcome of every attempt recorded in its shards.

Shards are the ledger (docs/resume.md): a record is written (atomically) once per finished attempt,
whatever its outcome. A sample is *done* when it has a non-failed record (kept or rejected at merge
time, both final) or a failure that is not retryable, or when it has used up ``max_attempts``.
Everything else is pending, and its next attempt number follows the highest one recorded.

A record counts only if the merge would accept it (``summarize`` succeeds): the ledger and the merge
must agree on what was recorded, or a sample could be skipped by a resume yet missing from ``data/``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raygen.errors import RETRYABLE, UNCOUNTED, failure_kind, is_failure_status
from raygen.formats.records import Trajectory
from raygen.input.pending import select_samples
from raygen.input.rows import Sample
from raygen.output.digests import iter_summaries
from raygen.output.run_dir import RunDir
from raygen.output.shards import ShardScanStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KeyState:
    """What the shards say about one sample key. One per sample for the whole run: slots and a shared
    empty ``uncounted`` keep it ~90 bytes (it was ~360, most of a million-sample driver's memory)."""

    attempts: int = 0
    """Highest attempt number recorded."""
    succeeded: bool = False
    """A non-failed attempt (kept or rejected) was recorded: the sample is final."""
    last_failure: str | None = None
    """Failure kind of the latest failed attempt."""
    uncounted: frozenset[int] = frozenset()
    """Attempts that ended with a failure not counted towards ``max_attempts`` (``budget_reached``)."""
    reopened_until: int = 0
    """Set by ``Ledger.reopen``: the sample may run again, up to this attempt number, whatever its last
    failure; a new failure is then judged as usual."""


@dataclass
class Ledger:
    """Per sample key, the attempts recorded so far; decides what runs next."""

    keys: dict[str, KeyState] = field(default_factory=dict)
    config_fingerprints: set[str] = field(default_factory=set)
    """Generation fingerprints found in the records (several only after a ``--force`` resume)."""
    records: int = 0
    """Valid records scanned."""
    spent_usd: float = 0.0
    """What every scanned attempt cost (``cost_usd``): the run's spend before this invocation."""
    spent_tokens: int = 0

    @classmethod
    def scan(cls, run_dir: Path | RunDir) -> Ledger:
        """Read every shard of ``run_dir`` (through the shard digests a run's compaction wrote, where
        they are valid); unreadable lines and invalid records are ignored, exactly as the merge ignores
        them."""
        ledger, run = cls(), RunDir.of(run_dir)
        fingerprints = ledger.config_fingerprints
        # Builds no digest: a resume starts no merge workers.
        for summary, pos in iter_summaries(run, ShardScanStats(), run.list_shards(), False, fingerprints):
            if isinstance(summary, Exception):
                log.warning("ledger: ignoring invalid record %s @%d: %s", pos.path, pos.offset, summary)
                continue
            ledger.records += 1
            ledger.spent_usd += summary.cost_usd
            ledger.spent_tokens += summary.prompt_tokens + summary.completion_tokens
            ledger.record(summary.sample_key, summary.attempt, summary.exit_status)
        return ledger

    def next_attempt(self, key: str, max_attempts: int) -> int | None:
        """The attempt number to run next for ``key``, or None when it is done."""
        state = self.keys.get(key)
        if state is None:
            return 1
        if state.succeeded:
            return None
        if state.attempts < state.reopened_until:
            return state.attempts + 1
        counted = state.attempts - len(state.uncounted)
        if state.last_failure not in RETRYABLE or counted >= max(max_attempts, state.reopened_until):
            return None
        return state.attempts + 1

    def reopen(self, kinds: Iterable[str], max_attempts: int) -> int:
        """``--retry-failed``: samples whose latest failure is one of ``kinds`` get ``max_attempts`` new
        attempts (their first one whatever the kind; later ones only after a retryable failure, as
        usual). Returns how many samples were reopened."""
        kinds = set(kinds)
        reopened = 0
        for state in self.keys.values():
            if not state.succeeded and state.last_failure in kinds:
                state.reopened_until = state.attempts + max_attempts
                reopened += 1
        return reopened

    def record(self, key: str, attempt: int, exit_status: str) -> None:
        """Count one finished attempt (from a shard, or delivered to this process)."""
        state = self.keys.setdefault(key, KeyState())
        if is_failure_status(exit_status):
            if failure_kind(exit_status) in UNCOUNTED:
                state.uncounted = state.uncounted | {attempt}
            if attempt >= state.attempts:
                state.last_failure = failure_kind(exit_status)
                if state.last_failure not in RETRYABLE:
                    state.reopened_until = 0  # a reopened sample failed finally again: done
        else:
            state.succeeded = True
        state.attempts = max(state.attempts, attempt)

    def lost_worker_before(self, sample: Sample) -> bool:
        """Whether the latest attempt of ``sample`` ended with its worker lost (``write_pending`` then
        runs it in a Ray task of its own)."""
        state = self.keys.get(sample.sample_key)
        return state is not None and not state.succeeded and state.last_failure == "worker_lost"

    def still_pending(self, pending_files: Iterable[Path], max_attempts: int) -> Iterator[Sample]:
        """The samples of a pass's files that have an attempt left to run, as that attempt: the next
        pass, planned without reading the dataset again (a sample not in the pass was already done)."""

        def has_attempt_left(key: str, _attempt: int) -> bool:
            return self.next_attempt(key, max_attempts) is not None

        for sample in select_samples(pending_files, has_attempt_left):
            attempt = self.next_attempt(sample.sample_key, max_attempts)
            yield sample.model_copy(update={"attempt": attempt})

    def undelivered(self, pending_files: Iterable[Path]) -> Iterator[Sample]:
        """The samples of a pass (its ``work/pending-*.jsonl`` files) for which no attempt at least as
        high as the one the pass ran was recorded: their worker died and Ray gave up on them."""

        def lost(key: str, attempt: int) -> bool:
            state = self.keys.get(key)
            return state is None or state.attempts < attempt

        return select_samples(pending_files, lost)


def worker_lost_record(sample: Sample, *, model: str, config_fingerprint: str, detail: str) -> Trajectory:
    """The ledger entry of an attempt whose session never came back (``error:worker_lost``).

    Written like any other failed attempt, so the attempt counts towards ``max_attempts`` across
    resumes: a sample that kills every worker it runs on is not retried forever.
    """
    row = sample.row
    return Trajectory(
        id=sample.record_id,
        sample_key=sample.sample_key,
        prompt_index=sample.prompt_index,
        attempt=sample.attempt,
        category=row.category,
        metadata=dict(row.metadata),
        completed=False,
        exit_status="error:worker_lost",
        error=detail,
        toolsets_used=list(sample.toolsets),
        model=model,
        config_fingerprint=config_fingerprint,
        group_id=sample.group_id,
        sample_index=sample.sample_index,
    )
