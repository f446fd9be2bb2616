"""The driver's two reads of the dataset, and what each collects.

1. ``check_dataset``: validation, the hygiene scan and the values of the rows' secret ``env`` variables
   (for the leak count after the merge), all fed by one read (``scan_dataset(on_row=...)``).
2. ``plan_samples``: every sample key (``keys.txt``), which samples are pending as which attempt, how many
   of those need an isolated environment; the pending samples are spooled to a local file as they are
   planned, so the first pass reads them from there and not from the dataset again.

Every other step works from these results: the dataset is read twice per run, whatever its size, and
nothing holds it whole (the keys set and the spool grow with it; rows do not).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from raygen.config import RunConfig
from raygen.hygiene import HygieneReport, HygieneScan
from raygen.input.rows import PromptRow, Sample
from raygen.input.validate import DatasetReport, iter_samples, scan_dataset
from raygen.run.generation import Generation
from raygen.run.ledger import Ledger


@dataclass
class DatasetChecks:
    report: DatasetReport
    hygiene: HygieneReport
    row_secrets: set[str] = field(default_factory=set)
    """Values of the rows' ``session.secret_env`` variables: never to be found in the output."""


def check_dataset(config: RunConfig, dataset: Path, known_toolsets: set[str]) -> DatasetChecks:
    """Validation, hygiene and the rows' secret values in one read. Hygiene and the secret values cover
    the rows that will run (the first ``config.limit`` valid ones)."""
    hygiene = HygieneScan(dataset, config.hygiene, config.session.secret_env)
    secret_names = set(config.session.secret_env)
    row_secrets: set[str] = set()
    rows = 0

    def on_row(line: int, row: PromptRow) -> None:
        nonlocal rows
        if config.limit is not None and rows >= config.limit:
            return
        rows += 1
        hygiene.add(line, row)
        row_secrets.update(value for name, value in row.env.items() if name in secret_names and value)

    report = scan_dataset(dataset, known_toolsets=known_toolsets, on_row=on_row)
    return DatasetChecks(report, hygiene.finish(), row_secrets)


@dataclass
class SamplePlan:
    expected: set[str]
    """Every sample key of the dataset (as run: ``limit``, ``samples_per_prompt``)."""
    pending: int = 0
    isolation_rows: int = 0
    """Pending samples whose row is marked ``needs_isolation``."""
    spool: Path | None = None
    """The pending samples, one JSON line each, as the attempt each runs next (None: not kept)."""

    def pending_samples(self, only: set[str] | None = None) -> Iterator[Sample]:
        """The spooled samples (those of ``only``, if given), as the attempt each runs next."""
        if self.spool is None:
            return
        with self.spool.open(encoding="utf-8") as handle:
            for line in handle:
                sample = Sample.model_validate_json(line)
                if only is None or sample.sample_key in only:
                    yield sample


def plan_samples(
    config: RunConfig, dataset: Path, generation: Generation, ledger: Ledger, held: ExitStack | None
) -> SamplePlan:
    """The second read. With ``held`` the pending samples are spooled to a temporary file removed when
    ``held`` closes (a dry run passes None: it runs nothing)."""
    plan = SamplePlan(expected=set())
    spool = None
    if held is not None:
        spool = held.enter_context(  # closed (and so removed) when the run ends, however it ends
            tempfile.NamedTemporaryFile("w", encoding="utf-8", prefix="raygen-plan-", suffix=".jsonl")  # noqa: SIM115
        )
        plan.spool = Path(spool.name)
    for sample in iter_samples(
        dataset,
        run_seed=config.seed,
        distribution=generation.distribution,
        limit=config.limit,
        samples_per_prompt=config.samples_per_prompt,
    ):
        plan.expected.add(sample.sample_key)
        attempt = ledger.next_attempt(sample.sample_key, config.retry.max_attempts)
        if attempt is None:
            continue
        plan.pending += 1
        plan.isolation_rows += sample.row.metadata.get("needs_isolation") is True
        if spool is not None:
            spool.write(sample.model_copy(update={"attempt": attempt}).model_dump_json() + "\n")
    if spool is not None:
        spool.flush()
    return plan
