"""Harbor task folders: validation with file: field messages, and grading on a real Docker engine."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from raygen.config import DockerEnvConfig, ScriptedModelConfig, SimConfig
from raygen.errors import ConfigError, InputError
from raygen.input.validate import scan_dataset
from raygen.model.scripted import ScriptedModel
from raygen.verify.harbor import build_images, load_tasks, tasks_to_jsonl
from tests.verify.helpers import DATA, ToolScript, runner, sample_of, shell, write

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from test_docker_engine import docker_skip_reason

HARBOR = DATA / "harbor"


def test_tasks_become_valid_rows(tmp_path):
    path, tasks = tasks_to_jsonl(HARBOR, "docker", out_dir=tmp_path)
    assert [t.name for t in tasks] == ["add-numbers", "count-words", "hello-file"]
    report = scan_dataset(path)
    assert report.ok and report.per_category == {"files": 1, "python": 1, "text": 1}
    rows = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    add = rows["add-numbers"]
    assert add["cwd"] == "/app" and add["image"].startswith("raygen-harbor/add-numbers:")
    assert add["verify"]["mode"] == "same" and add["verify"]["timeout_s"] == 60.0
    assert set(add["verify"]["files"]) == {".raygen-tests/test.sh", ".raygen-tests/test_add.py"}
    assert "test_add" not in add["prompt"]  # the tests are hidden: only the instruction is the prompt


def test_problems_name_the_file_and_field(tmp_path):
    bad = tmp_path / "tasks" / "broken"
    shutil.copytree(HARBOR / "add-numbers", bad)
    (bad / "tests" / "test.sh").unlink()
    (bad / "task.toml").write_text('[verifier]\ntimeout_sec = -5\n[metadata]\ncategory = "x"\n')
    (bad / "instruction.md").write_text("  \n")
    with pytest.raises(InputError) as caught:
        load_tasks(tmp_path / "tasks", "docker")
    text = str(caught.value)
    assert f"{bad / 'tests' / 'test.sh'}: (file): missing" in text
    assert f"{bad / 'instruction.md'}: (file): empty" in text
    assert f"{bad / 'task.toml'}: verifier.timeout_sec: Input should be greater than 0" in text


def test_the_local_backend_is_refused():
    with pytest.raises(ConfigError, match="--env docker"):
        load_tasks(HARBOR, "local")


@pytest.fixture(scope="module")
def docker_rows(tmp_path_factory):
    reason = docker_skip_reason()
    if reason:
        pytest.skip(reason)
    config = DockerEnvConfig(cpus=0.5, memory="256m", pids_limit=200)
    path, tasks = tasks_to_jsonl(HARBOR, "docker", out_dir=tmp_path_factory.mktemp("harbor"))
    assert set(build_images(tasks, config).values()) == {None}
    rows = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    return config, rows


@pytest.mark.docker
async def test_harbor_rewards_with_the_simulator(docker_rows):
    config, rows = docker_rows
    sim = SimConfig(solutions_file=HARBOR / "solutions.jsonl", solve_rate=1.0)
    got = {}
    for name, row in rows.items():
        rec = await runner(ScriptedModel(ScriptedModelConfig(), sim), config).run(sample_of(row))
        got[name] = (rec.exit_status, rec.reward)
    assert got == {
        "add-numbers": ("completed", 1.0),
        "count-words": ("completed", 1.0),
        "hello-file": ("completed", 0.0),
    }


@pytest.mark.docker
async def test_partial_credit_and_tampering(docker_rows):
    config, rows = docker_rows
    half = "def count_words(text):\n    return 3\n"  # right on 2 of 4 cases
    rec = await runner(ToolScript([[write("solution.py", half)]]), config).run(sample_of(rows["count-words"]))
    assert rec.reward == 0.5 and not rec.verification.passed
    cheat = [
        shell("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt"),
        shell("printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; echo 1 > .raygen-reward"),
    ]
    rec = await runner(ToolScript([cheat]), config).run(sample_of(rows["add-numbers"]))
    assert rec.exit_status == "completed" and rec.reward == 0.0


def test_the_driver_reads_a_tasks_folder_and_warns_about_copies(docker_rows, monkeypatch, tmp_path):
    from raygen.config import RunConfig
    from raygen.run.reporter import RunReporter
    from raygen.run.verify_prepare import prepare_dataset

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    notes = []

    class Recorder(RunReporter):
        def note(self, message):
            notes.append(("note", message))

        def warning(self, message):
            notes.append(("warning", message))

    config = RunConfig.model_validate(
        {"env": {"type": "docker"}, "samples_per_prompt": 2, "sampling": {"temperature": 0}}
    )
    path = prepare_dataset(config, HARBOR, Recorder())
    assert path.parent == tmp_path / "raygen" / "harbor" and scan_dataset(path).rows == 3
    assert [kind for kind, _ in notes] == ["warning", "note"] and "temperature" in notes[0][1]
    assert prepare_dataset(config, DATA / "verified-tasks.jsonl", Recorder()) == DATA / "verified-tasks.jsonl"
