"""Generate docs/configuration.md from the pydantic config models' field docstrings.

``python -m raygen.docs_gen`` rewrites the file; a test fails when the checked-in file is stale, so the
reference can never drift from the code.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raygen.config import RunConfig

HEADER = """# Configuration reference

Generated from the docstrings in `raygen/config.py` (and the backends' `raygen/envs/configs.py`,
`raygen/model/configs.py`) by `python -m raygen.docs_gen` (a test keeps it in
sync). Every option can be set in a YAML file with the same nesting (`raygen run -c run.yaml`), or one
at a time on the command line with its dotted key, the value read as YAML: `raygen run prompts.jsonl -c
session.max_turns=12 -c 'sampling.extra_body={reasoning: {effort: high}}'`. Files and `-c key=value`
settings apply in the order given (later wins), and the named flags of `raygen run --help` win over both.
Backend sections (`model`, `env`, `agent`) choose their backend with `type`; a section without `type`
means the default backend: `local` for `env`; for `model`, `openai` if it has a `base_url`, else `sim`
(the built-in simulator, also the default when there is no `model` section); for `agent`, `command` if it
has a `command`, else `builtin`.
"""


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    for noise in (
        "typing.",
        "pathlib.",
        "raygen.config.",
        "raygen.envs.configs.",
        "raygen.model.configs.",
        "raygen.agents.configs.",
        "<class '",
        "'>",
    ):
        text = text.replace(noise, "")
    return text.replace("NoneType", "None").replace("Annotated[", "").split(", FieldInfo")[0]


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    found = []
    for arg in typing.get_args(annotation):
        found.extend(_models(arg))
    return found


def _section(model: type[BaseModel], path: str, out: list[str]) -> None:
    title = f"`{path}`" if path else "top level"
    type_field = model.model_fields.get("type")
    if type_field is not None and path and type_field.default is not None:
        title += f" with `type: {type_field.default}`"
    out.append(f"\n## {title}\n")
    if model.__doc__:
        out.append(" ".join(model.__doc__.split()) + "\n")
    out.append("| option | type | default | meaning |\n|---|---|---|---|")
    nested: list[tuple[str, list[type[BaseModel]]]] = []
    for name, field in model.model_fields.items():
        subs = _models(field.annotation)
        if subs:
            nested.append((f"{path}.{name}" if path else name, subs))
            default = "see below"
        else:
            default = (
                "required" if field.is_required() else f"`{field.get_default(call_default_factory=True)!r}`"
            )
        doc = " ".join((field.description or "").split()).replace("|", "\\|")
        type_name = _type_name(field.annotation).replace("|", "\\|")
        out.append(f"| `{name}` | `{type_name}` | {default} | {doc} |")
    for sub_path, subs in nested:
        for sub in subs:
            _section(sub, sub_path, out)


def render() -> str:
    out = [HEADER]
    _section(RunConfig, "", out)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    target = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
