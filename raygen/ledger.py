"""What a run folder already holds: the outcome of every attempt recorded in its shards.

Shards are the ledger: a record is written (atomically) once per finished attempt, whatever its
outcome. A sample is *done* when it has a non-failed record (kept or rejected at merge time, both final)
or a failure that is not retryable, or when it has used up ``max_attempts``. Everything else is pending,
and its next attempt number follows the highest one recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raygen.errors import RETRYABLE, failure_kind, is_failure_status
from raygen.output.shards import iter_shard_records


@dataclass
class KeyState:
    attempts: int = 0
    """Highest attempt number recorded."""
    succeeded: bool = False
    last_failure: str | None = None
    """Failure kind of the latest failed attempt."""


@dataclass
class Ledger:
    keys: dict[str, KeyState] = field(default_factory=dict)
    config_fingerprints: set[str] = field(default_factory=set)
    records: int = 0

    @classmethod
    def scan(cls, run_dir: Path) -> Ledger:
        ledger = cls()
        for record, _pos in iter_shard_records(run_dir):
            key = record.get("sample_key")
            if not isinstance(key, str):
                continue
            ledger.records += 1
            state = ledger.keys.setdefault(key, KeyState())
            attempt = int(record.get("attempt") or 1)
            status = str(record.get("exit_status") or "")
            if record.get("config_fingerprint"):
                ledger.config_fingerprints.add(record["config_fingerprint"])
            if is_failure_status(status):
                if attempt >= state.attempts:
                    state.last_failure = failure_kind(status)
            else:
                state.succeeded = True
            state.attempts = max(state.attempts, attempt)
        return ledger

    def next_attempt(self, key: str, max_attempts: int) -> int | None:
        """The attempt number to run next for ``key``, or None when it is done."""
        state = self.keys.get(key)
        if state is None:
            return 1
        if state.succeeded or state.last_failure not in RETRYABLE or state.attempts >= max_attempts:
            return None
        return state.attempts + 1

    def record(self, key: str, attempt: int, exit_status: str) -> None:
        """Update with an attempt finished in this process (same rules as ``scan``)."""
        state = self.keys.setdefault(key, KeyState())
        if is_failure_status(exit_status):
            if attempt >= state.attempts:
                state.last_failure = failure_kind(exit_status)
        else:
            state.succeeded = True
        state.attempts = max(state.attempts, attempt)
