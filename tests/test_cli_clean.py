"""`raygen clean RUN_DIR` removes what a killed run left on this node, through the backend's ``reap`` hook
(with a real Docker engine: tests/envs/test_docker.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.config import RunConfig
from raygen.envs import environment_class
from raygen.output.run_dir import MANIFEST_FILE, RunDir

runner = CliRunner()


def run_folder(tmp_path, env: dict, run_name: str = "killed-run") -> RunDir:
    """A run folder as a killed run leaves it: a manifest naming the run and its backend."""
    config = RunConfig.model_validate(
        {"env": env, "output": {"output_dir": str(tmp_path), "run_name": run_name}}
    )
    folder = RunDir.of(tmp_path / run_name)
    folder.create()
    folder.write_json(MANIFEST_FILE, {"config": config.model_dump(mode="json")})
    return folder


@pytest.mark.parametrize("env_type", ["docker", "singularity", "modal", "local"])
def test_clean_asks_the_runs_backend_to_reap(tmp_path, monkeypatch, env_type):
    cls = environment_class(env_type)
    calls = []

    def reap(_cls, config, run_name):
        calls.append((config.type, run_name))
        return 3

    monkeypatch.setattr(cls, "reap", classmethod(reap))
    result = runner.invoke(app, ["clean", str(run_folder(tmp_path, {"type": env_type}))])
    assert result.exit_code == 0, result.output
    assert calls == [(env_type, "killed-run")]
    assert "removed 3" in result.output


def test_clean_of_a_local_run_removes_nothing(tmp_path):
    result = runner.invoke(app, ["clean", str(run_folder(tmp_path, {"type": "local"}))])
    assert result.exit_code == 0, result.output
    assert "removed 0" in result.output
