"""Before any model call: ``raygen run`` scans the prompts (warn or refuse) and ``--dry-run`` runs nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from raygen.cli.console import ConsoleReporter
from raygen.config import RunConfig
from raygen.errors import InputError
from raygen.run.driver import run

ROOT = Path(__file__).resolve().parents[2]
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "List the files."}, {"prompt": f"Use {AWS_KEY} for s3"}, {"prompt": "Sum 1..10"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def config(tmp_path: Path, **hygiene) -> RunConfig:
    return RunConfig.model_validate(
        {
            "dataset": str(prompts(tmp_path)),
            "model": {"type": "scripted"},
            "env": {"type": "fake"},
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": "try1"},
            "hygiene": hygiene,
        }
    )


def test_warn_prints_masked_findings_and_goes_on(tmp_path):
    buffer = io.StringIO()
    result = run(config(tmp_path), dry_run=True, reporter=ConsoleReporter(Console(file=buffer, width=200)))
    text = buffer.getvalue()
    assert result.hygiene is not None and result.hygiene.secrets == {"AWS Access Key": 1}
    assert "prompts.jsonl:2: prompt: secret AWS Access Key: AK**" in text
    assert AWS_KEY not in text
    assert "at most 30 model calls" in text  # 3 sessions x max_turns 10
    assert not (tmp_path / "runs").exists()


def test_refuse_stops_before_anything_is_created(tmp_path):
    buffer = io.StringIO()
    with pytest.raises(InputError, match=r"hygiene\.on_findings is refuse") as info:
        run(config(tmp_path, on_findings="refuse"), reporter=ConsoleReporter(Console(file=buffer, width=200)))
    assert [(p.line, p.kind) for p in info.value.problems] == [(2, "AWS Access Key")]
    assert AWS_KEY not in str(info.value) + buffer.getvalue() + "".join(map(str, info.value.problems))
    assert not (tmp_path / "runs").exists()
    # --limit 1 only sends the first (clean) row, so nothing is refused.
    limited = config(tmp_path, on_findings="refuse").model_copy(update={"limit": 1})
    assert run(limited, dry_run=True, reporter=ConsoleReporter(Console(file=io.StringIO()))).pending == 1


@pytest.mark.slow  # a fresh interpreter importing the CLI: a few seconds
def test_cli_dry_run_prints_config_and_estimate_and_starts_nothing(tmp_path):
    # In a fresh interpreter, so "ray was never imported" means something.
    script = textwrap.dedent(
        f"""
        import sys
        from raygen.cli.main import app
        try:
            app(["run", "examples/prompts.jsonl", "--dry-run", "--limit", "10", "--workers", "1",
                 "--output-dir", {str(tmp_path / "runs")!r}, "--run-name", "try1"])
        except SystemExit as exc:
            code = exc.code
        print("RAY IMPORTED" if "ray" in sys.modules else "ray not imported")
        sys.exit(code)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "resolved config:" in proc.stderr and "workers: 1" in proc.stderr and "limit: 10" in proc.stderr
    assert "hygiene: 10 rows scanned" in proc.stderr
    assert "dry run: at most 100 model calls (10 sessions x max_turns 10); nothing was run" in proc.stderr
    assert "ray not imported" in proc.stdout
    assert not (tmp_path / "runs").exists()
