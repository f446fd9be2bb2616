"""The driver reads the dataset twice per run (docs/architecture.md, "Data flow"): once to validate it
and scan it for secrets, once to plan. The pending samples are spooled by the plan, and the leak check
uses the secret values the first read collected."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

import raygen.input.validate as validate
from raygen.cli.console import ConsoleReporter
from raygen.config import RunConfig
from raygen.run.driver import run


@pytest.fixture
def dataset_reads(monkeypatch) -> list[Path]:
    """Every open of a prompts file by the input layer, the one place that reads datasets."""
    reads: list[Path] = []
    real_open = validate._open

    def counting_open(path: Path):
        reads.append(Path(path))
        return real_open(path)

    monkeypatch.setattr(validate, "_open", counting_open)
    return reads


def _dataset(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": f"echo row {i}", "env": {"TOKEN": f"row-secret-{i:04d}"}} for i in range(rows)]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    return path


def _config(tmp_path: Path, dataset: Path, **extra) -> RunConfig:
    return RunConfig.model_validate(
        {
            "dataset": str(dataset),
            "model": {"type": "scripted"},
            "env": {"type": "fake"},
            "session": {"secret_env": ["TOKEN"]},
            "ray": {"workers": 1, "sessions_per_worker": 8},
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": "twice"},
            **extra,
        }
    )


def _quiet() -> ConsoleReporter:
    return ConsoleReporter(Console(file=io.StringIO()))


def test_a_dry_run_reads_the_dataset_twice(tmp_path, dataset_reads):
    dataset = _dataset(tmp_path, 30)
    result = run(_config(tmp_path, dataset), dry_run=True, reporter=_quiet())
    assert result.pending == 30
    assert dataset_reads == [dataset, dataset]


@pytest.mark.ray
def test_a_run_reads_the_dataset_twice(tmp_path, dataset_reads, monkeypatch):
    spools = tmp_path / "tmp"
    spools.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spools))  # where the plan spools the pending samples
    dataset = _dataset(tmp_path, 40)
    result = run(_config(tmp_path, dataset, limit=25), reporter=_quiet())
    assert dataset_reads == [dataset, dataset]
    assert result.sessions_run == 25
    out = result.run_dir.local_path
    data = [json.loads(line) for path in (out / "data").glob("*.jsonl") for line in path.open()]
    assert len(data) == 25 and len({record["sample_key"] for record in data}) == 25
    # The leak check knew the rows' secret values from the first read: none reached the output.
    hygiene = json.loads((out / "statistics.json").read_text())["hygiene"]
    assert hygiene["secret_leaks"] == 0
    # Resuming a finished run plans from the ledger: two reads again, nothing to run, no spool left.
    again = run(_config(tmp_path, dataset, limit=25), resume=True, reporter=_quiet())
    assert again.sessions_run == 0 and dataset_reads == [dataset] * 4
    assert list(spools.iterdir()) == []
