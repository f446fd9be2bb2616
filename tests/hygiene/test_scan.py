"""scan_hygiene and ``raygen hygiene`` on planted files, an eval set, and the real dataset (tests/data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raygen.cli.main import app
from raygen.config import HygieneConfig
from raygen.errors import ConfigError
from raygen.hygiene import scan_hygiene
from raygen.hygiene.overlap import EvalIndex

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
URL_PASSWORD = "Sup3rS3cretPw"
ENV_SECRET = "q8Zr2mK4vX9t"
SECRETS = (AWS_KEY, GITHUB_TOKEN, URL_PASSWORD, ENV_SECRET, "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo")

ROWS = [
    {"prompt": f"List buckets with key {AWS_KEY}"},  # 1
    {"prompt": "Sort the numbers in data.txt"},  # 2: clean
    {"prompt": f"Push using token {GITHUB_TOKEN}"},  # 3
    {"prompt": "Install:\n-----BEGIN OPENSSH PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n"},  # 4
    {"prompt": f"Clone https://alice:{URL_PASSWORD}@git.internal.io/x.git"},  # 5
    {"prompt": "Mail jane.doe@gmail.com, call (650) 253-0000, charge 4111 1111 1111 1111"},  # 6
    {"prompt": "Not a card: 4111 1111 1111 1112; docs: bob@example.com"},  # 7: clean
    {"prompt": "Run the tests", "env": {"SERVICE_TOKEN": ENV_SECRET}},  # 8
    {"prompt": "ok", "metadata": {"owner": "x.lee@corp.io"}},  # 9
    {"prompt": "Count the lines of every .py file under src"},  # 10: clean
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def planted(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "prompts.jsonl", ROWS)


def test_planted_findings_by_line_field_and_kind(planted):
    report = scan_hygiene(planted)
    got = {(f.line, f.field, f.category, f.kind) for f in report.findings}
    assert got == {
        (1, "prompt", "secret", "AWS Access Key"),
        (3, "prompt", "secret", "GitHub Token"),
        (4, "prompt", "secret", "Private Key"),
        (5, "prompt", "secret", "Basic Auth Credentials"),
        (6, "prompt", "pii", "email"),
        (6, "prompt", "pii", "phone"),
        (6, "prompt", "pii", "card_number"),
        (8, "env.SERVICE_TOKEN", "secret", "Secret Assignment"),
        (9, "metadata.owner", "pii", "email"),
    }
    assert report.rows == 10 and report.rows_with_findings == 7 and report.has_findings
    assert report.secrets == {
        "AWS Access Key": 1,
        "Basic Auth Credentials": 1,
        "GitHub Token": 1,
        "Private Key": 1,
        "Secret Assignment": 1,
    }
    assert report.pii == {"card_number": 1, "email": 2, "phone": 1}
    text = "\n".join([json.dumps(report.to_dict()), *map(str, report.findings), *report.summary_lines()])
    for secret in (*SECRETS, "jane.doe", "253-0000", "4111 1111 1111 1111"):
        assert secret not in text


def test_declared_secret_env_is_not_a_finding_and_switches_work(planted):
    report = scan_hygiene(planted, secret_env=["SERVICE_TOKEN"])
    assert not any(f.field.startswith("env.") for f in report.findings)
    assert scan_hygiene(planted, HygieneConfig(pii=False)).pii == {}
    assert scan_hygiene(planted, HygieneConfig(secrets=False)).secrets == {}
    limited = scan_hygiene(planted, limit=3)
    assert limited.rows == 3 and {f.line for f in limited.findings} == {1, 3}
    with pytest.raises(ConfigError, match="phone_region"):
        scan_hygiene(planted, HygieneConfig(phone_region="XX"))


def test_eval_set_exact_and_near_duplicates(tmp_path, planted):
    eval_rows = [
        {"prompt": "unrelated: compute the factorial of n recursively"},  # 1
        {"prompt": "  SORT the numbers in data.txt!  "},  # 2: exact after normalisation (row 2)
        {"question": "no prompt field here"},  # 3: skipped
        {"prompt": "Count the lines of every .py file under the src folder"},  # 4: near row 10
    ]
    eval_set = write_jsonl(tmp_path / "eval.jsonl", eval_rows)
    report = scan_hygiene(planted, HygieneConfig(eval_set=eval_set))
    assert report.eval_rows == 3
    overlaps = {(o.line, o.kind, o.eval_line) for o in report.overlaps}
    assert overlaps == {(2, "exact", 2), (10, "near", 4)}
    assert report.overlap_counts == {"exact": 1, "near": 1}
    near = next(o for o in report.overlaps if o.kind == "near")
    assert 0.6 <= near.similarity < 1.0

    # A stricter threshold keeps the exact match and drops the near one.
    strict = scan_hygiene(planted, HygieneConfig(eval_set=eval_set, near_duplicate_threshold=0.95))
    assert {(o.line, o.kind) for o in strict.overlaps} == {(2, "exact")}


def test_eval_index_reads_plain_text_and_other_fields(tmp_path):
    (tmp_path / "eval.txt").write_text("first line of text\n\nsecond one here\n", encoding="utf-8")
    index = EvalIndex.from_file(tmp_path / "eval.txt")
    assert index.rows == 2 and index.match("Second one HERE.").eval_line == 3
    rows = [{"text": "Write a function to reverse a list"}, "a bare JSON string"]
    write_jsonl(tmp_path / "mbpp.jsonl", rows)
    index = EvalIndex.from_file(tmp_path / "mbpp.jsonl", text_field="text")
    assert index.match("write a function to reverse a list").kind == "exact"
    assert index.match("a bare json string").eval_line == 2
    assert index.match("something else entirely") is None


def test_cli_exit_codes_and_masked_json(planted, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["hygiene", str(planted), "--json"])
    assert result.exit_code == 1, result.output
    body = json.loads(result.stdout)
    assert body["has_findings"] and len(body["findings"]) == 9
    for secret in SECRETS:
        assert secret not in result.output
    clean = write_jsonl(tmp_path / "clean.jsonl", [ROWS[1], ROWS[6]])
    result = runner.invoke(app, ["hygiene", str(clean)])
    assert result.exit_code == 0, result.output
    eval_set = write_jsonl(tmp_path / "eval.jsonl", [ROWS[1]])
    result = runner.invoke(app, ["hygiene", str(clean), "--eval-set", str(eval_set)])
    assert result.exit_code == 1 and "also in the eval set at line 1" in result.output
    assert runner.invoke(app, ["hygiene", str(tmp_path / "missing.jsonl")]).exit_code == 2


def test_real_dataset_counts_are_plausible(tmp_path, agent_tasks):
    report = scan_hygiene(agent_tasks)
    # 589 public-benchmark prompts (code, SQL, shell tasks): no credentials, no personal data; the
    # destructive shell tasks are natural language ("Remove all *.txt files ..."), not commands.
    assert report.rows >= 580
    assert report.secrets == {} and report.pii == {}
    assert report.unsafe_commands == {}
    # HumanEval prompts as an eval set (without the generation set's instruction line): most of the 164
    # are found, nothing else is.
    rows = [json.loads(line) for line in agent_tasks.open(encoding="utf-8")]
    humaneval = [r["prompt"].split("\n\n", 1)[1] for r in rows if r["id"].startswith("humaneval-")]
    eval_set = write_jsonl(tmp_path / "he.jsonl", [{"prompt": p} for p in humaneval])
    report = scan_hygiene(agent_tasks, HygieneConfig(eval_set=eval_set))
    lines = {o.line for o in report.overlaps}
    he_lines = {i for i, r in enumerate(rows, 1) if r["id"].startswith("humaneval-")}
    assert len(lines & he_lines) >= 0.6 * len(he_lines)
    assert lines <= he_lines


def test_validate_helper_prints_warnings_or_returns_the_report(planted, tmp_path):
    import io

    from rich.console import Console

    from raygen.cli.hygiene import validate_hygiene

    buffer = io.StringIO()
    report = validate_hygiene(planted, None, as_json=False, console=Console(file=buffer, width=300))
    assert report.finding_count == 9
    assert "warning: " in buffer.getvalue() and AWS_KEY not in buffer.getvalue()
    quiet = io.StringIO()
    eval_set = write_jsonl(tmp_path / "eval.jsonl", [ROWS[1]])
    report = validate_hygiene(planted, eval_set, as_json=True, console=Console(file=quiet))
    assert quiet.getvalue() == "" and report.overlap_counts["exact"] == 1
