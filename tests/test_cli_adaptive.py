"""``--adaptive/--no-adaptive`` reach ``governor.adaptive`` (dry runs, no model calls)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from raygen.cli import main as cli


@pytest.mark.parametrize(
    ("flags", "shown"),
    [([], "adaptive: null"), (["--adaptive"], "adaptive: true"), (["--no-adaptive"], "adaptive: false")],
)
def test_adaptive_flags_set_the_governor(tmp_path, flags, shown):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "list files"}) + "\n")
    args = ["run", str(data), "--dry-run", "--output-dir", str(tmp_path / "runs"), *flags]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index("governor:")
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    assert shown in block
