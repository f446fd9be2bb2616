"""What the driver refuses before any model call (no Ray needed: all of it happens first)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from raygen.cli.console import ConsoleReporter
from raygen.config import RunConfig
from raygen.configfile import load_config
from raygen.errors import ConfigError, InputError
from raygen.run.driver import run


def cfg(tmp_path, dataset, **model) -> RunConfig:
    return load_config(
        None,
        {
            "dataset": str(dataset),
            "model": model,
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": "r"},
        },
    )


def quiet() -> ConsoleReporter:
    return ConsoleReporter(Console(file=io.StringIO()))


def test_needs_isolation_rows_refused_on_bare_local_with_a_real_model(tmp_path, agent_tasks, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    config = cfg(tmp_path, agent_tasks, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match="needs_isolation"):
        run(config, dry_run=True, reporter=quiet())
    # with the simulator (no base_url) the scripted policy only runs printf: allowed
    result = run(cfg(tmp_path, agent_tasks), dry_run=True, reporter=quiet())
    assert result.pending == 589 and not (tmp_path / "runs").exists()


def test_missing_api_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("MY_KEY", raising=False)
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ConfigError, match="MY_KEY"):
        run(cfg(tmp_path, data, base_url="http://127.0.0.1:9/v1", api_key_env="MY_KEY"), reporter=quiet())


def test_bad_dataset_raises_input_error_with_every_problem(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": 1}\n\n{"id": "a"}\n')
    with pytest.raises(InputError) as info:
        run(cfg(tmp_path, data), reporter=quiet())
    assert [p.line for p in info.value.problems] == [1, 3]
    assert not (tmp_path / "runs").exists()


def test_existing_run_folder_needs_resume(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="--resume"):
        run(cfg(tmp_path, data), reporter=quiet())
