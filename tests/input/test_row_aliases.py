"""Row fields spelled as the reference runner spells them: ``docker_image`` is ``image``."""

from __future__ import annotations

import json

from raygen.input.validate import iter_samples, scan_dataset


class Terminal:
    def draw(self, run_seed: int, sample_key: str) -> list[str]:
        return ["terminal"]


def test_docker_image_is_accepted_as_image(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [
        {"prompt": "a", "docker_image": "python:3.11-slim"},
        {"prompt": "a", "image": "python:3.11-slim"},
        {"prompt": "b", "image": "alpine:3", "docker_image": "alpine:3"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = scan_dataset(path)
    assert report.ok and not [n for n in report.notices if n.field == "docker_image"]
    samples = list(iter_samples(path, run_seed=0, distribution=Terminal()))
    assert [s.row.image for s in samples] == ["python:3.11-slim", "python:3.11-slim", "alpine:3"]
    assert samples[0].row.metadata == {}  # not moved aside as an unknown field
    # Spelled either way, it is the same row (so the same sample content, resumable across spellings).
    assert samples[0].row == samples[1].row


def test_differing_image_and_docker_image_is_an_error_naming_line_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"prompt": "a", "image": "a:1", "docker_image": "b:2"}) + "\n", encoding="utf-8"
    )
    report = scan_dataset(path)
    (problem,) = report.problems
    assert (problem.line, problem.field) == (1, "docker_image") and "differs from 'image'" in problem.message
