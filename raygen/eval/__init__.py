"""Looking at a finished run: ``raygen report`` (one offline HTML page), ``raygen sample`` (a seeded,
stratified review sample) and ``raygen compare`` (two runs' statistics side by side).

Everything here reads a merged run folder (``manifest.json``, ``statistics.json``, ``data/``,
``rejected/``, ``failed/``) in one streaming pass at most; nothing needs Ray or a model.

Public API (imported lazily, so ``raygen --help`` does not pay for it):
``write_report`` / ``build_report`` (raygen.eval.report), ``write_sample`` (raygen.eval.sample),
``compare_runs`` / ``comparability_problems`` / ``RunsNotComparable`` (raygen.eval.compare).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ReportResult": "raygen.eval.report",
    "build_report": "raygen.eval.report",
    "write_report": "raygen.eval.report",
    "SampleResult": "raygen.eval.sample",
    "write_sample": "raygen.eval.sample",
    "RunsNotComparable": "raygen.eval.compare",
    "comparability_problems": "raygen.eval.compare",
    "compare_runs": "raygen.eval.compare",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
