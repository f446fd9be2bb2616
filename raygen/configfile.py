"""YAML config + CLI overrides -> RunConfig. Flags override the file, key by key (deep merge)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raygen.config import RunConfig
from raygen.errors import ConfigError

# Backend sections are discriminated unions; a section given without ``type`` means the default backend.
_DEFAULT_TYPES = {"model": "openai", "env": "local"}


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            # A different backend type replaces the section instead of mixing two backends' fields.
            if "type" in value and out[key].get("type") not in (None, value["type"]):
                out[key] = dict(value)
            else:
                out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def set_path(target: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_path(d, "model.base_url", v)`` -> ``d["model"]["base_url"] = v``."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    data = deep_merge(data, overrides or {})
    for section, default in _DEFAULT_TYPES.items():
        if isinstance(data.get(section), dict):
            data[section].setdefault("type", default)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        where = f" in {path}" if path else ""
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines)) from None
