"""Tests for raygen.input.validate: the streaming scan and the sample stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygen.errors import InputError
from raygen.input import lines, validate
from raygen.input.rows import PromptRow, make_sample_key
from raygen.input.validate import iter_samples, scan_dataset

KNOWN = {"terminal", "file"}


class FixedDraw:
    """A stand-in distribution that records what it was asked."""

    def __init__(self, toolsets: list[str]):
        self.toolsets = toolsets
        self.calls: list[tuple[int, str]] = []

    def draw(self, run_seed: int, sample_key: str) -> list[str]:
        self.calls.append((run_seed, sample_key))
        return list(self.toolsets)


def write_lines(path: Path, lines: list[bytes | str | dict]) -> Path:
    encoded = [
        line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode()
        for line in lines
    ]
    path.write_bytes(b"\n".join(encoded) + b"\n")
    return path


BAD_UTF8 = b'{"prompt": "bad \xff byte"}'

MALFORMED = [
    b'\xef\xbb\xbf{"prompt": "ok", "id": "a"}',  # 1 valid, with a BOM
    b"",  # 2 blank
    b"   \t ",  # 3 whitespace only
    BAD_UTF8,  # 4
    b'{"prompt": "x",}',  # 5 invalid JSON
    b"[1, 2]",  # 6 not an object
    b'{"id": "b"}',  # 7 missing prompt
    b'{"prompt": "  \\n "}',  # 8 whitespace-only prompt
    b'{"prompt": 5, "env": {"FOO": 1}, "toolsets": ["terminal", 3]}',  # 9 wrong types
    b'{"prompt": "dup id", "id": "a"}',  # 10 duplicate id
    b'{"prompt": "t", "toolsets": ["terminal", "flie"]}',  # 11 unknown toolset
    b'{"prompt": "lone \\ud800"}',  # 12 lone surrogate
    b'{"prompt": "typo", "imgae": "ubuntu"}',  # 13 unknown field (notice)
    b'{"prompt": "ok"}',  # 14 identical prompt to line 1 (notice)
    b'"just a string"',  # 15 not an object
    b'{"prompt": ""}',  # 16 empty prompt
]


def test_malformed_file_reports_every_problem_with_line_and_field(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", MALFORMED)
    report = scan_dataset(path, known_toolsets=KNOWN)

    found = {(p.line, p.field) for p in report.problems}
    assert found == {
        (4, "(utf-8)"),
        (5, "(json)"),
        (6, "(row)"),
        (7, "prompt"),
        (8, "prompt"),
        (9, "prompt"),
        (9, "env.FOO"),
        (9, "toolsets[1]"),
        (10, "id"),
        (11, "toolsets[1]"),
        (12, "prompt"),
        (15, "(row)"),
        (16, "prompt"),
    }
    assert not report.ok
    assert report.problem_count == len(report.problems) == 13
    assert report.lines == 16
    assert report.rows == 3  # lines 1, 13, 14
    by_key = {(p.line, p.field): p for p in report.problems}
    bad_byte_column = BAD_UTF8.index(b"\xff") + 1
    assert f"byte column {bad_byte_column}" in by_key[(4, "(utf-8)")].message
    assert "column 16" in by_key[(5, "(json)")].message
    assert "array" in by_key[(6, "(row)")].message
    assert "missing" in by_key[(7, "prompt")].message
    assert "empty" in by_key[(8, "prompt")].message
    assert "line 1" in by_key[(10, "id")].message
    assert "'flie'" in by_key[(11, "toolsets[1]")].message and "'file'" in by_key[(11, "toolsets[1]")].message
    assert str(by_key[(7, "prompt")]).startswith(f"{path}:7: prompt: ")

    notices = {(n.line, n.field) for n in report.notices}
    assert notices == {(13, "imgae"), (14, "prompt")}
    assert report.identical_prompts == 1
    with pytest.raises(InputError) as info:
        report.raise_if_invalid()
    assert len(info.value.problems) == 13


def test_did_you_mean_and_unknown_fields_move_into_metadata(tmp_path):
    path = write_lines(
        tmp_path / "typos.jsonl",
        [
            {"prompt": "a", "imgae": "ubuntu:24.04"},
            {"prompt": "b", "categroy": "x", "metadata": {"categroy": "kept"}},
            {"prompt": "c", "zzzzqq": 1},
        ],
    )
    report = scan_dataset(path)
    assert report.ok
    messages = {n.field: n.message for n in report.notices}
    assert "did you mean 'image'?" in messages["imgae"]
    assert "did you mean 'category'?" in messages["categroy"]
    assert "did you mean" not in messages["zzzzqq"]

    samples = list(iter_samples(path, run_seed=0, distribution=FixedDraw(["terminal"])))
    assert samples[0].row.metadata == {"imgae": "ubuntu:24.04"}
    assert samples[0].row.image is None
    assert samples[1].row.metadata == {"categroy": "kept", "_extra_fields": {"categroy": "x"}}
    assert samples[2].row.metadata == {"zzzzqq": 1}


def test_real_dataset_validates(agent_tasks):
    report = scan_dataset(agent_tasks, known_toolsets=KNOWN)
    assert report.ok, [str(p) for p in report.problems]
    assert report.rows == 589
    assert report.per_category == {"bash": 224, "sql": 98, "python": 262, "edge": 5}
    assert report.identical_prompts == 1
    assert [n.field for n in report.notices] == ["prompt"]
    assert report.size_bytes == agent_tasks.stat().st_size
    assert report.to_dict()["ok"] is True
    json.dumps(report.to_dict())  # JSON-able

    samples = list(iter_samples(agent_tasks, run_seed=3, distribution=FixedDraw(["terminal"])))
    assert [s.prompt_index for s in samples] == list(range(589))
    assert len({s.sample_key for s in samples}) == 589
    assert len({s.record_id for s in samples}) == 589


def test_sample_keys_survive_reordering_and_insertion(tmp_path):
    rows = [{"prompt": "alpha"}, {"prompt": "beta", "id": "b"}, {"prompt": "gamma", "env": {"A": "1"}}]
    first = write_lines(tmp_path / "a.jsonl", rows)
    shuffled = write_lines(
        tmp_path / "b.jsonl", [rows[2], {"prompt": "inserted"}, "", rows[0], {"prompt": "other"}, rows[1]]
    )
    draw = FixedDraw(["file"])

    def keys(path: Path) -> dict[str, str]:
        return {s.row.prompt: s.sample_key for s in iter_samples(path, run_seed=0, distribution=draw)}

    before, after = keys(first), keys(shuffled)
    assert all(before[p] == after[p] for p in before)
    assert len(set(after.values())) == len(after)


def test_identical_rows_are_distinct_samples_with_stable_keys(tmp_path):
    twin = {"prompt": "same", "category": "x"}
    path = write_lines(tmp_path / "twins.jsonl", [twin, {"prompt": "mid"}, twin])
    report = scan_dataset(path)
    assert report.ok and report.identical_prompts == 1 and report.rows == 3
    samples = [
        s for s in iter_samples(path, run_seed=0, distribution=FixedDraw([])) if s.row.prompt == "same"
    ]
    assert len(samples) == 2
    assert samples[0].sample_key != samples[1].sample_key
    content = PromptRow(**twin).content_hash()
    assert [s.sample_key for s in samples] == [make_sample_key(content, 0), make_sample_key(content, 1)]

    # Inserting unrelated rows before them changes neither key.
    moved = write_lines(tmp_path / "moved.jsonl", [{"prompt": "new"}, twin, twin, {"prompt": "mid"}])
    again = [
        s.sample_key
        for s in iter_samples(moved, run_seed=0, distribution=FixedDraw([]))
        if s.row == samples[0].row
    ]
    assert again == [s.sample_key for s in samples]


def test_limit_and_positions_skip_blank_lines(tmp_path):
    path = write_lines(
        tmp_path / "p.jsonl", ["", {"prompt": "one"}, "  ", {"prompt": "two"}, {"prompt": "three"}]
    )
    samples = list(iter_samples(path, run_seed=0, distribution=FixedDraw(["terminal"]), limit=2))
    assert [(s.row.prompt, s.prompt_index, s.line) for s in samples] == [("one", 0, 2), ("two", 1, 4)]
    assert len(list(iter_samples(path, run_seed=0, distribution=FixedDraw([]), limit=10))) == 3


def test_row_toolsets_override_the_draw(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [{"prompt": "a", "toolsets": ["terminal"]}, {"prompt": "b"}])
    draw = FixedDraw(["file", "terminal"])
    samples = list(iter_samples(path, run_seed=9, distribution=draw))
    assert samples[0].toolsets == ["terminal"]
    assert samples[1].toolsets == ["file", "terminal"]
    assert draw.calls == [(9, samples[1].sample_key)]


def test_iter_samples_refuses_a_file_that_became_invalid(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [{"prompt": "a"}, b"{oops"])
    with pytest.raises(InputError, match=r"x\.jsonl:2"):
        list(iter_samples(path, run_seed=0, distribution=FixedDraw([])))


def test_stored_problems_are_capped_but_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "MAX_STORED", 5)
    path = write_lines(tmp_path / "garbage.jsonl", [b"not json"] * 12)
    report = scan_dataset(path)
    assert report.problem_count == 12 and len(report.problems) == 5
    assert any("7 more" in line for line in report.summary_lines())


def test_overlong_line_is_reported_and_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MAX_LINE_BYTES", 64)
    path = write_lines(tmp_path / "long.jsonl", [{"prompt": "x" * 200}, {"prompt": "short"}])
    report = scan_dataset(path)
    assert [(p.line, p.field) for p in report.problems] == [(1, "(line)")]
    assert report.rows == 1 and report.lines == 2
    assert report.size_bytes == path.stat().st_size


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    assert not scan_dataset(empty).ok
    with pytest.raises(InputError, match="cannot read"):
        scan_dataset(tmp_path / "absent.jsonl")


def test_per_category_counts_none_and_images(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl",
        [
            {"prompt": "a", "category": "bash", "image": "img"},
            {"prompt": "b"},
            {"prompt": "c", "category": "bash"},
        ],
    )
    report = scan_dataset(path)
    assert report.per_category == {"(none)": 1, "bash": 2}
    assert report.with_image == 1
