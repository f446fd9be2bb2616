"""The CLI's flags and ``-c key.path=value`` overrides reach the config (dry runs, no model calls)."""

from __future__ import annotations

import json
import typing

from typer.testing import CliRunner

from raygen import cli
from raygen.cli_options import Sets
from raygen.configfile import load_config, set_path


def _flag_keys(command) -> dict[str, str]:
    hints = typing.get_type_hints(command, include_extras=True)
    return {
        name: marker.key
        for name, hint in hints.items()
        for marker in getattr(hint, "__metadata__", ())
        if isinstance(marker, Sets)
    }


def test_every_flag_names_a_real_config_key():
    """A typo in a flag's key would only show when someone passes the flag: check them all now."""
    samples = {bool: True, int: 1, float: 1.0, str: "x"}
    for command in (cli.run, cli.sim_serve):
        keys = _flag_keys(command)
        assert len(keys) >= 8
        for name, key in keys.items():
            hint = typing.get_args(typing.get_type_hints(command)[name])[0]
            value = "local" if key == "env.type" else samples.get(hint, "x")
            data: dict = {"model": {"base_url": "http://x/v1"}} if key.startswith("model.") else {}
            set_path(data, key, value)
            load_config(None, data)  # raises ConfigError naming the key if it does not exist


def test_override_reaches_the_resolved_config(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "list files"}) + "\n")
    args = ["run", str(data), "--dry-run", "--output-dir", str(tmp_path / "runs"), "--workers", "3"]
    args += ["-c", "sampling.temperature=0.25", "-c", "governor.tpm=5000", "-c", "ray.workers=9"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert "temperature: 0.25" in result.output and "tpm: 5000.0" in result.output
    assert "workers: 3" in result.output  # the named flag wins over -c
    assert not (tmp_path / "runs").exists()


def test_bad_override_exits_2_naming_the_key(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "list files"}) + "\n")
    result = CliRunner().invoke(cli.app, ["run", str(data), "--dry-run", "-c", "sampling.temprature=0.2"])
    assert result.exit_code == 2
    assert "-c sampling.temprature=0.2: sampling.temprature: Extra inputs are not permitted" in result.output


def test_merge_and_run_share_the_filter_flags():
    run_filters = {k: v for k, v in _flag_keys(cli.run).items() if v.startswith("filters.")}
    assert run_filters == _flag_keys(cli.merge) and len(run_filters) == 4
