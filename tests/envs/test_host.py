"""raygen.envs.host: removing session workdirs (small ones on the loop) and raygen.envs.processes'
check for processes working inside one."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from raygen.envs.host import make_workdir, remove_small_tree, remove_tree
from raygen.envs.processes import anyone_inside


def _tree(top: Path, files: int) -> Path:
    for i in range(files):
        sub = top / f"d{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_text("x")
    (top / "link").symlink_to("/etc")
    return top


def test_a_small_tree_is_removed_and_a_symlink_is_not_followed(tmp_path):
    top = _tree(tmp_path / "w", 10)
    assert remove_small_tree(top) is True
    assert not top.exists()
    assert Path("/etc").is_dir()


def test_a_large_tree_is_left_for_a_thread(tmp_path):
    top = _tree(tmp_path / "w", 100)
    assert remove_small_tree(top, max_entries=64) is None
    assert 0 < len(list(top.rglob("*"))) < 104  # stopped at the budget ...
    assert remove_tree(top) and not top.exists()  # ... and the thread's remove_tree takes the rest


def test_a_read_only_folder_is_left_for_remove_tree_which_makes_it_writable(tmp_path):
    top = _tree(tmp_path / "w", 4)
    locked = top / "d0"
    locked.chmod(0o500)
    try:
        if os.geteuid() != 0:  # root may delete in a read-only folder anyway
            assert remove_small_tree(top) is None
        assert remove_tree(top) and not top.exists()
    finally:
        if locked.exists():
            locked.chmod(0o700)


def test_a_missing_tree_counts_as_removed(tmp_path):
    assert remove_small_tree(tmp_path / "never") is True


def test_anyone_inside_sees_a_process_working_in_the_folder(tmp_path):
    inside = tmp_path / "w" / "deep"
    inside.mkdir(parents=True)
    workdir = str((tmp_path / "w").resolve())
    assert not anyone_inside(workdir)
    proc = subprocess.Popen(["sleep", "30"], cwd=inside)
    try:
        deadline = time.monotonic() + 10
        while not anyone_inside(workdir) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert anyone_inside(workdir)
        assert not anyone_inside(workdir + "-other")  # a prefix is not "inside"
    finally:
        proc.kill()
        proc.wait()
    assert not anyone_inside(workdir)
    assert os.path.isdir(inside)


def test_a_small_tree_that_cannot_go_at_once_is_left_for_the_retrying_thread(tmp_path, monkeypatch):
    top = _tree(tmp_path / "w", 5)

    def busy(path, *args, **kwargs):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr("raygen.envs.host.os.unlink", busy)
    assert remove_small_tree(top) is None  # no sleeping retry here: the caller's thread does that
    assert top.exists()


def test_make_workdir_resolves_its_parent_and_leaves_nothing_when_a_subfolder_fails(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    made = make_workdir(tmp_path / "link" / "runs", "raygen-x-", ("home", "tmp"))
    assert made.parent == (tmp_path / "real" / "runs").resolve() and made.name.startswith("raygen-x-")
    assert sorted(p.name for p in made.iterdir()) == ["home", "tmp"]
    with pytest.raises(FileNotFoundError):
        make_workdir(tmp_path / "link" / "runs", "raygen-y-", ("home", "no/such/parent"))
    assert [p.name for p in (tmp_path / "real" / "runs").iterdir()] == [made.name]
