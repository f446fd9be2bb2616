"""Hostile prompt files (issue 15, case 7): values execve refuses, NaN, a JSON array, a huge line. Each is
found by ``validate`` with file, line and field, before any model call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.input.validate import LARGE_LINE_BYTES, scan_dataset

KNOWN = {"terminal", "file"}


def scan(tmp_path: Path, text: str | bytes):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return scan_dataset(path, KNOWN)


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"prompt": "p", "cwd": "/app\u0000x"}, "cwd", "NUL"),
        ({"prompt": "p", "env": {"A=B": "1"}}, "env", "'A=B' contains '='"),
        ({"prompt": "p", "env": {"": "1"}}, "env", "name is empty"),
        ({"prompt": "p", "env": {"A\u0000": "1"}}, "env", "NUL"),
        ({"prompt": "p", "env": {"A": "x\u0000y"}}, "env", "value of A contains a NUL"),
        # issue 28 case 8: passed validate, then failed after the model calls as error:internal.
        ({"prompt": "p", "verify": {"command": "pytest\u0000-q"}}, "verify.command", "NUL"),
    ],
)
def test_values_no_process_can_take_are_errors_of_their_line(tmp_path: Path, row, field, words):
    good = json.dumps({"prompt": "fine"})
    report = scan(tmp_path, f"{good}\n{json.dumps(row)}\n")
    assert report.rows == 1 and report.problem_count == 1
    problem = report.problems[0]
    assert (problem.line, problem.field) == (2, field) and words in problem.message
    assert str(problem).startswith(f"{tmp_path / 'prompts.jsonl'}:2: {field}: ")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_errors_naming_the_field(tmp_path: Path, literal: str):
    report = scan(tmp_path, f'{{"prompt": "p", "metadata": {{"scores": [1, {literal}]}}}}\n')
    assert report.rows == 0 and report.problem_count == 1
    assert report.problems[0].field == "metadata.scores[1]" and "NaN/Infinity" in report.problems[0].message


def test_a_nan_inside_a_string_is_fine(tmp_path: Path):
    assert scan(tmp_path, '{"prompt": "is NaN a number? Infinity?"}\n').ok


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_file_gets_a_hint(tmp_path: Path, indent):
    report = scan(tmp_path, json.dumps([{"prompt": "a"}, {"prompt": "b"}], indent=indent) + "\n")
    assert not report.ok
    first = report.problems[0]
    assert first.field == "(file)" and "JSON array, not JSON Lines" in first.message
    assert "jq -c" in first.message


def test_jsonl_with_a_bad_line_gets_no_array_hint(tmp_path: Path):
    report = scan(tmp_path, '{"prompt": "a"}\n[1]\n')
    assert report.problem_count == 1 and report.problems[0].field == "(row)"


def test_a_huge_prompt_line_passes_with_a_warning(tmp_path: Path):
    big = json.dumps({"prompt": "x" * (LARGE_LINE_BYTES + 10)})
    report = scan(tmp_path, f'{big}\n{{"prompt": "small"}}\n')
    assert report.ok and report.rows == 2
    [notice] = [n for n in report.notices if n.field == "(line)"]
    assert notice.line == 1 and f"over {LARGE_LINE_BYTES}" in notice.message


def test_validate_names_a_nul_in_a_check_command(tmp_path: Path):
    # issue 28 case 8 through the command a user runs before spending anything.
    from typer.testing import CliRunner

    from raygen.cli import main as cli

    # A path longer than the console is wide: the error must name it whole, never wrapped mid-word
    # (CI's deeper temporary folders once split "prompts.jsonl" across two lines).
    deep = tmp_path / ("a-long-folder-name-" * 4)
    deep.mkdir()
    path = deep / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "p", "verify": {"command": "pytest\u0000-q"}}) + "\n")
    result = CliRunner().invoke(cli.app, ["validate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"error: {path}:1: verify.command: contains a NUL character" in result.output
