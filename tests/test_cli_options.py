"""The CLI's flags and ``-c key.path=value`` overrides reach the config (dry runs, no model calls)."""

from __future__ import annotations

import json
import time
import typing

from typer.testing import CliRunner

from raygen.cli import main as cli
from raygen.cli.options import Sets
from raygen.config import MAX_SAMPLES_PER_PROMPT, RunConfig
from raygen.docs_gen import _models


def _flag_keys(command) -> dict[str, str]:
    hints = typing.get_type_hints(command, include_extras=True)
    return {
        name: marker.key
        for name, hint in hints.items()
        for marker in getattr(hint, "__metadata__", ())
        if isinstance(marker, Sets)
    }


def _is_config_key(key: str) -> bool:
    """Whether ``key`` names a field of RunConfig (in any backend of a discriminated section)."""
    models = [RunConfig]
    for part in key.split("."):
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if not fields:
            return False
        models = [m for f in fields for m in _models(f.annotation)]
    return True


def test_every_flag_names_a_real_config_key():
    """A typo in a flag's key would only show when someone passes the flag: check them all now."""
    for command in (cli.run, cli.merge, cli.sim_serve):
        keys = _flag_keys(command)
        assert keys
        assert [key for key in keys.values() if not _is_config_key(key)] == []
    assert not _is_config_key("ray.wrokers") and not _is_config_key("model.nope")


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
    def filters(command):
        return {k: v for k, v in _flag_keys(command).items() if v.startswith("filters.")}

    assert filters(cli.run) == filters(cli.merge) and len(filters(cli.run)) >= 4


def test_samples_per_prompt_beyond_its_limit_is_refused_at_once(tmp_path):
    # issue 28 case 10: --samples-per-prompt 100000000 had no bound; a dry run sat silent making keys.
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "list files"}) + "\n")
    base = ["run", str(data), "--dry-run", "--output-dir", str(tmp_path / "runs")]
    for extra in (["--samples-per-prompt", "100000000"], ["-c", "samples_per_prompt=1025"]):
        started = time.monotonic()
        result = CliRunner().invoke(cli.app, base + extra)
        assert time.monotonic() - started < 10
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if "samples_per_prompt" in line]
        assert len(lines) == 1 and f"less than or equal to {MAX_SAMPLES_PER_PROMPT}" in lines[0], (
            result.output
        )
    result = CliRunner().invoke(cli.app, [*base, "--samples-per-prompt", str(MAX_SAMPLES_PER_PROMPT)])
    assert result.exit_code == 0, result.output
    assert "run p-" in result.output and f"{MAX_SAMPLES_PER_PROMPT} samples" in result.output
    assert not (tmp_path / "runs").exists()


def test_a_nan_sampling_value_stops_the_run_before_anything_starts(tmp_path):
    # issue 28 case 2, as a user meets it: no config error, NaN in manifest.json, every call failed.
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "list files"}) + "\n")
    args = ["run", str(data), "--dry-run", "--output-dir", str(tmp_path / "runs")]
    args += ["-c", "sampling.temperature=.nan"]  # (a dry run: before the fix it ran on, and exited 0)
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output
    assert (
        "-c sampling.temperature=.nan: sampling.temperature: Input should be a finite number" in result.output
    )
    assert not (tmp_path / "runs").exists()
