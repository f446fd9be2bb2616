"""docs/configuration.md is generated from the config docstrings and must be current."""

from pathlib import Path

from raygen.config import RunConfig
from raygen.docs_gen import _models, render

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == render(), "run: python -m raygen.docs_gen"


def test_every_option_of_every_section_has_a_docstring():
    seen, todo = set(), [RunConfig]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            todo.extend(_models(field.annotation))
    assert len(seen) > 10  # the walk really reached the nested sections
