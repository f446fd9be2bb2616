"""``--check``: the chat template renders every trajectory, and its tokens are the server's."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from raygen.cli import app
from raygen.export.run import ExportOptions, export_run
from tests.export.conftest import TOKENIZER


def _variant(tmp_path, old: str, new: str) -> str:
    """A copy of the test tokenizer whose chat template has ``old`` replaced by ``new``."""
    folder = tmp_path / "variant-tokenizer"
    shutil.copytree(TOKENIZER, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    assert old in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(old, new)
    config_path.write_text(json.dumps(config))
    return str(folder)


def test_the_servers_template_matches_every_captured_trajectory(run_dir, tmp_path):
    first = export_run(
        run_dir, ExportOptions(fmt="openai", out=str(tmp_path / "a"), tokenizer=TOKENIZER, check=True)
    )
    tokens = first.check["tokens"]
    assert tokens["min"] < tokens["max"]
    limit = (tokens["min"] + tokens["max"]) // 2
    out = tmp_path / "checked"
    result = CliRunner().invoke(
        app,
        [
            "export",
            str(run_dir),
            "--to",
            "openai",
            "--out",
            str(out),
            "--tokenizer",
            TOKENIZER,
            "--check",
            "--max-length",
            str(limit),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "6 of 6 compared" in result.output
    check = json.loads((out / "template_check.json").read_text())
    assert check["records"] == check["rendered"] == 8 and check["render_failures"] == 0
    assert check["server_ids"] == {"compared": 6, "matched": 6, "mismatched": 0, "mismatch_examples": []}
    assert sum(check["tokens"]["histogram"].values()) == 8
    assert check["tokens"]["min"] <= check["tokens"]["median"] <= check["tokens"]["max"]
    over = check["over_max_length"]
    assert over == len(check["over_max_length_examples"]) and 0 < over < 8  # the limit splits the run
    # a copy for `raygen report`, naming the export
    assert json.loads((run_dir / "template_check.json").read_text())["export"] == str(out)
    assert json.loads((out / "export.json").read_text())["skipped"] == {f"over --max-length {limit}": over}


def test_a_different_template_is_caught_where_it_differs(run_dir, tmp_path):
    """A tokenizer whose template shows tool results differently from the server's: every captured
    trajectory differs, first after its first reply (in a tool result, not in the prompt)."""
    variant = _variant(
        tmp_path,
        "{%- else %}",
        "{%- elif message.role == 'tool' %}{{- '<|im_start|>tool:\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- else %}",
    )
    result = export_run(
        run_dir, ExportOptions(fmt="trl", out=str(tmp_path / "o"), tokenizer=variant, check=True)
    )
    served = result.check["server_ids"]
    assert served["compared"] == served["mismatched"] == 6 and served["matched"] == 0
    first = served["mismatch_examples"][0]
    assert (first["turn"], first["part"]) == (1, "prompt")  # the first prompt has no tool result yet
    assert "tool:\n" in first["rendered"] and "tool:\n" not in first["served"]


def test_a_template_that_cannot_render_is_reported(run_dir, tmp_path):
    variant = _variant(
        tmp_path,
        "{%- else %}",
        "{%- elif message.role == 'tool' %}{{ raise_exception('no tool role') }}{%- else %}",
    )
    out = tmp_path / "tokens"
    result = export_run(run_dir, ExportOptions(fmt="tokens", out=str(out), tokenizer=variant, check=True))
    assert result.check["render_failures"] == 8 and result.check["rendered"] == 0
    assert "no tool role" in result.check["render_failure_examples"][0]["error"]
    # the captured trajectories still export from the server's ids; the others cannot
    assert result.rows == 6 and result.sources == {"captured": 6}
    assert result.skipped == {"no token ids captured (sampling.return_token_ids) and the template failed": 2}


def test_the_report_shows_the_last_check(run_dir, tmp_path):
    from raygen.eval.report import build_report

    (run_dir / "template_check.json").unlink(missing_ok=True)
    html, _, _ = build_report(run_dir)
    assert 'id="tokens"' in html and "No template check yet" in html
    export_run(run_dir, ExportOptions(fmt="tokens", out=str(tmp_path / "t"), tokenizer=TOKENIZER, check=True))
    html, _, _ = build_report(run_dir)
    assert "Tokens per trajectory" in html and "same tokens as the server" in html
    assert "6 of 6" in html and "No template check yet" not in html
