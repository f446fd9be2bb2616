"""A row's ``verify``: validated like every other field, with file:line: field: message problems."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from raygen.input.validate import scan_dataset
from raygen.input.verify_spec import VerifySpec
from tests.verify.helpers import TASKS


def test_the_shared_dataset_form_is_valid():
    report = scan_dataset(TASKS)
    assert report.ok and report.rows == 12 and report.notice_count == 0


def test_bad_verify_fields_are_named_with_file_and_line(tmp_path):
    rows = [
        {"prompt": "a", "verify": {"command": "true", "timeout_s": -1}},
        {"prompt": "b", "verify": {"command": "true", "files": {"../escape.py": "x"}}},
        {"prompt": "c", "verify": {"files": {}}},
        {"prompt": "d", "verify": {"command": "true", "result": "stdout"}},
        {"prompt": "e", "verify": {"command": "true", "mode": "same", "artifacts": ["/etc/passwd"]}},
        {"prompt": "f", "verify": {"command": "true", "files": {"t.py": "x"}, "artifacts": ["t.py"]}},
        {"prompt": "g", "verify": {"command": "true", "timeout": 3}},
        {"prompt": "ok", "verify": {"command": "true"}},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = scan_dataset(path)
    found = {(p.line, p.field): p.message for p in report.problems}
    assert str(report.problems[0]).startswith(f"{path}:1: verify.timeout_s: ")
    assert "greater than 0" in found[(1, "verify.timeout_s")]
    assert "relative path" in found[(2, "verify.files")]
    assert "set one of command" in found[(3, "verify")]
    assert "'exit_code', 'reward_file' or 'last_line'" in found[(4, "verify.result")]
    assert "relative path" in found[(5, "verify.artifacts[0]")]
    assert "both a hidden file and an artifact" in found[(6, "verify")]
    assert (7, "verify.timeout") in found
    assert report.rows == 1


@pytest.mark.parametrize("path", ["/abs.py", "..", "a/../../b", "", "a\\b"])
def test_paths_must_stay_inside_the_working_directory(path):
    with pytest.raises(ValidationError):
        VerifySpec(command="true", files={path: "x"})


def test_mode_defaults_to_fresh():
    assert VerifySpec(command="true").resolved_mode == "fresh"
    assert VerifySpec(command="true", mode="same").resolved_mode == "same"
