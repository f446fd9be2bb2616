"""What the driver does for verified runs before the first model call (one hook in ``raygen.run.driver``):
read a Harbor tasks folder as a prompts file (building its images), and warn about settings that make
several samples per prompt pointless."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from raygen.errors import InputError
from raygen.input.validate import DatasetReport, Finding
from raygen.run.reporter import RunReporter


def prepare_dataset(config: Any, dataset: Path, reporter: RunReporter) -> Path:
    """The prompts file to run: ``dataset`` itself, or the JSONL made from a folder of Harbor tasks."""
    _warn_deterministic(config, reporter)
    if not dataset.is_dir():
        return dataset
    from raygen.verify.harbor import build_images, tasks_to_jsonl

    path, tasks = tasks_to_jsonl(dataset, config.env.type)
    reporter.note(f"{dataset}: {len(tasks)} Harbor task(s) read as {path}")
    problems = {image: why for image, why in build_images(tasks, config.env).items() if why}
    if problems:
        raise InputError(
            f"{dataset}: {len(problems)} task image(s) could not be built",
            [f"{k}: {v}" for k, v in problems.items()],
        )
    return path


def task_findings(report: DatasetReport, source: Path) -> DatasetReport:
    """``report`` of the prompts file made from the Harbor tasks folder ``source``, its notices and
    problems naming the task's own file (``TASK/instruction.md`` for the prompt, ``TASK/task.toml`` for
    the rest) instead of a line of the cached file; line N is the N-th task folder. Any other report
    is returned as it is."""
    if not source.is_dir():
        return report
    from raygen.verify.harbor import task_folders

    folders = task_folders(source)

    def task_name(match: re.Match[str]) -> str:
        number = int(match[1])
        return f"task {folders[number - 1].name}" if 1 <= number <= len(folders) else match[0]

    def relabel(finding: Finding) -> Any:
        if not 1 <= finding.line <= len(folders):
            return finding
        name = "instruction.md" if finding.field in ("prompt", "(line)") else "task.toml"
        message = re.sub(r"\bline (\d+)\b", task_name, finding.message)
        return replace(finding, path=str(folders[finding.line - 1] / name), line=0, message=message)

    report.path = str(source)
    report.notices = [relabel(n) for n in report.notices]
    report.problems = [relabel(p) for p in report.problems]
    return report


def _warn_deterministic(config: Any, reporter: RunReporter) -> None:
    if config.samples_per_prompt > 1 and config.sampling.temperature == 0:
        reporter.warning(
            f"--samples-per-prompt {config.samples_per_prompt} with sampling.temperature "
            "0: the samples of a group will be (nearly) identical; set -c sampling.temperature=0.7 or so"
        )
