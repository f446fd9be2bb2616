"""The library reports, the CLI renders: ``raygen.run.driver.run`` prints nothing itself."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from raygen.configfile import load_config
from raygen.run.driver import run
from raygen.run.reporter import RunReporter


class Recorder(RunReporter):
    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def dataset_checked(self, report):
        self.calls.append(("dataset", report.rows))

    def hygiene_checked(self, report, *, refused):
        self.calls.append(("hygiene", (report.has_findings, refused)))

    def note(self, text):
        self.calls.append(("note", text))

    def warning(self, text):
        self.calls.append(("warning", text))


def _config(tmp_path, rows):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_config(None, {"dataset": str(data), "output": {"output_dir": str(tmp_path), "run_name": "r"}})


def test_a_run_reports_through_its_reporter(tmp_path):
    recorder = Recorder()
    rows = [{"prompt": "list files"}, {"prompt": "use the key AKIAIOSFODNN7EXAMPLE to list the bucket"}]
    run(_config(tmp_path, rows), dry_run=True, reporter=recorder)
    assert recorder.calls[0] == ("dataset", 2)
    assert recorder.calls[1] == ("hygiene", (True, False))  # the AWS key: a warning, not a refusal
    notes = [text for kind, text in recorder.calls if kind == "note"]
    assert notes[0] == "run r: 2 samples, 0 already done, 2 to run" and notes[-1].startswith("dry run:")


def test_without_a_reporter_the_library_logs_and_prints_nothing(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="raygen"):
        run(_config(tmp_path, [{"prompt": "list files"}]), dry_run=True)
    assert capsys.readouterr() == ("", "")
    assert "run r: 1 samples, 0 already done, 1 to run" in caplog.messages


def test_the_driver_does_not_import_the_terminal_renderer():
    code = "import sys, raygen.run.driver; print('rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
