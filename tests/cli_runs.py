"""Running ``raygen run`` as a subprocess with a YAML config, and reading a run folder back with ``json``
only (independently of raygen's own readers). Importable from every test folder: tests/ is on sys.path
through its conftest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


def write_dataset(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def run_with_config(
    dataset: Path, config: dict[str, Any], config_path: Path, *extra: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``raygen run DATASET --config CONFIG_PATH EXTRA...`` with ``config`` written there as YAML."""
    config_path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "raygen.cli", "run", str(dataset), "--config", str(config_path), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


ROOT = Path(__file__).resolve().parent.parent


def raygen_ok(*args: str) -> subprocess.CompletedProcess:
    """``raygen ARGS...`` from the repository root (the examples' configs name files relative to it);
    asserts it exited 0, with its stderr's tail."""
    done = subprocess.run(
        [sys.executable, "-m", "raygen.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(paths) for line in Path(p).read_text().splitlines() if line]


def run_records(run: Path) -> dict[str, list[dict[str, Any]]]:
    """The records of a run folder by outcome: ``kept`` (data/), ``rejected``, ``failed``."""
    return {
        "kept": read_jsonl(run.glob("data/*.jsonl")),
        "rejected": read_jsonl(run.glob("rejected/*.jsonl")),
        "failed": read_jsonl(run.glob("failed/*.jsonl")),
    }


def load_json_with_datasets(tmp: Path, *files: Path) -> dict[str, Any]:
    """``datasets.load_dataset("json", data_files=files)`` in a fresh offline process (its own HF_HOME):
    rows and columns, or a failed ``CompletedProcess`` as ``{"error": stderr}``."""
    script = (
        "import json, sys\n"
        "import datasets\n"
        "ds = datasets.load_dataset('json', data_files=sys.argv[1:], split='train')\n"
        "print(json.dumps({'rows': ds.num_rows, 'columns': ds.column_names}))\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf")}
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, files)], env=env, capture_output=True, text=True, timeout=240
    )
    if done.returncode != 0:
        return {"error": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])
