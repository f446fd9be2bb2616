"""What the driver does for verified runs before the first model call (one hook in ``raygen.run.driver``):
read a Harbor tasks folder as a prompts file (building its images), and warn about settings that make
several samples per prompt pointless."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raygen.errors import InputError
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


def _warn_deterministic(config: Any, reporter: RunReporter) -> None:
    if config.samples_per_prompt > 1 and config.sampling.temperature == 0:
        reporter.warning(
            f"--samples-per-prompt {config.samples_per_prompt} with sampling.temperature "
            "0: the samples of a group will be (nearly) identical; set -c sampling.temperature=0.7 or so"
        )
