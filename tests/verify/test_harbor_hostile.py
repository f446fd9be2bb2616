"""Hostile Harbor task folders (issue 28 cases 5, 6, 11): files that are not text or not files, links out of
the task folder, and warnings that name the task folder. No Docker needed: all of it happens while the
folder is read, before any image or model."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from raygen.cli.console import ConsoleReporter
from raygen.errors import InputError
from raygen.input.validate import scan_dataset
from raygen.verify.harbor import load_tasks, tasks_to_jsonl
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


def test_links_that_leave_the_task_folder_are_refused(tmp_path):
    secret = tmp_path / "home" / ".aws" / "credentials"
    secret.parent.mkdir(parents=True)
    secret.write_text("aws_secret_access_key = AKIAHOSTILE0000000000\n")
    root = _tasks(tmp_path)
    task = root / "add-numbers"
    (task / "tests" / "creds.txt").symlink_to(secret)
    (task / "tests" / "home").symlink_to(secret.parent.parent)
    problems = _problems(root)
    assert problems == [
        f"{task / 'tests' / 'creds.txt'}: (file): a symbolic link out of the task folder (to {secret}); "
        "task folders are shared: copy the file in",
        f"{task / 'tests' / 'home'}: (file): a symbolic link out of the task folder "
        f"(to {secret.parent.parent}); task folders are shared: copy the file in",
    ]
    # The same for the prompt itself: a link would send the file to the provider.
    (task / "tests" / "creds.txt").unlink()
    (task / "tests" / "home").unlink()
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to(secret)
    assert len(_problems(root)) == 1
    # A link that stays inside the task folder is fine, and its content is staged.
    (task / "instruction.md").unlink()
    (task / "instruction.md").write_text("Add the numbers.\n")
    (task / "tests" / "copy_of_test.sh").symlink_to("test.sh")
    (task / "environment" / "link").symlink_to("../tests/test.sh")
    path, _ = tasks_to_jsonl(root, "docker", out_dir=tmp_path / "cache")
    files = json.loads(path.read_text().splitlines()[0])["verify"]["files"]
    assert files[".raygen-tests/copy_of_test.sh"] == files[".raygen-tests/test.sh"]
    assert "AKIAHOSTILE" not in path.read_text()


def test_a_task_folder_link_loop_or_device_is_refused_not_read(tmp_path):
    root = _tasks(tmp_path)
    tests = root / "add-numbers" / "tests"
    (tests / "zero").symlink_to(os.devnull)
    assert any("a symbolic link out of the task folder" in line for line in _problems(root))


def test_warnings_name_the_task_folder_in_plain_text(tmp_path):
    from raygen.run.verify_prepare import task_findings

    root = _tasks(tmp_path, "add-numbers", "count-words")
    same = (root / "add-numbers" / "instruction.md").read_text()
    (root / "count-words" / "instruction.md").write_text(same)
    path, _ = tasks_to_jsonl(root, "docker", out_dir=tmp_path / "cache")
    report = task_findings(scan_dataset(path), root)
    out = io.StringIO()
    ConsoleReporter(Console(file=out, width=400)).dataset_checked(report)
    text = out.getvalue()
    assert "Notice(" not in text and str(tmp_path / "cache") not in text, text
    warning = f"warning: {root / 'count-words' / 'instruction.md'}: prompt: same prompt as task add-numbers;"
    assert any(line.startswith(warning) for line in text.splitlines()), text
    # A report of a prompts file is left as it is.
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "a"}\n{"prompt": "a"}\n')
    assert str(task_findings(scan_dataset(plain), plain).notices[0]).startswith(f"{plain}:2: prompt: ")


def test_the_run_command_says_each_task_problem_in_one_line(tmp_path):
    # Cases 5 and 6 as a user meets them: `raygen run TASKS --env docker` stops before any image or model.
    from typer.testing import CliRunner

    from raygen.cli import main as cli

    root = _tasks(tmp_path, "add-numbers", "count-words")
    (root / "add-numbers" / "instruction.md").write_bytes(b"\xff\xfe")
    (root / "count-words" / "tests" / "key").symlink_to("/etc/hostname")
    args = ["run", str(root), "--env", "docker", "--output-dir", str(tmp_path / "runs")]
    result = CliRunner().invoke(cli.app, args, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.exit_code == 2 and result.exception is not None and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert f"{root / 'add-numbers' / 'instruction.md'}: (file): not UTF-8 text" in said
    assert f"{root / 'count-words' / 'tests' / 'key'}: (file): a symbolic link out of the task folder" in said
    assert not (tmp_path / "runs").exists()
