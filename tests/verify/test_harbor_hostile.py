"""Hostile Harbor task folders (issue 28 cases 5, 6, 11): files that are not text or not files, links out of
the task folder, and warnings that name the task folder. No Docker needed: all of it happens while the
folder is read, before any image or model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raygen.errors import InputError
from raygen.verify.harbor import load_tasks
from tests.verify.helpers import DATA

HARBOR = DATA / "harbor"


def _tasks(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "tasks"
    for name in names or ("add-numbers",):
        shutil.copytree(HARBOR / name, root / name, symlinks=True)
    return root


def _problems(root: Path) -> list[str]:
    with pytest.raises(InputError) as caught:
        load_tasks(root, "docker")
    return str(caught.value).splitlines()[1:]


def test_an_instruction_that_is_not_text_or_not_a_file_is_one_line(tmp_path):
    root = _tasks(tmp_path)
    instruction = root / "add-numbers" / "instruction.md"
    instruction.write_bytes(b"Add \xff\xfe numbers\n")
    assert _problems(root) == [f"{instruction}: (file): not UTF-8 text (invalid start byte at byte 4)"]
    instruction.unlink()
    instruction.mkdir()
    assert _problems(root) == [f"{instruction}: (file): a directory, not a file"]
    toml = root / "add-numbers" / "task.toml"
    toml.unlink()
    toml.mkdir()
    assert f"{toml}: (file): a directory, not a file" in _problems(root)
