"""The run-level leak check: how often any secret value still occurs in a run's output files.

Sessions scrub secret values as they go (``raygen.formats.scrub``); this check is the independent
count afterwards, over every text file of the run folder (``data/``, ``rejected/``, ``failed/``,
``shards/``, the manifest ...; not the transient ``work/``), wherever it is stored (``RunDir``). Parquet
shards are skipped: they are compressed copies of ``data/*.jsonl``, which is checked. Only counts leave
this module, never a value.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from raygen.formats.scrub import Scrubber
from raygen.output.run_dir import RunDir

_SKIPPED_SUFFIXES = (".parquet",)


def host_secret_values(names: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of the named variables in the driver's environment (unset or empty ones are skipped)."""
    environ = os.environ if environ is None else environ
    return [environ[name] for name in names if environ.get(name)]


def _pattern(values: Iterable[str]) -> re.Pattern[bytes] | None:
    forms: set[bytes] = set()
    # Scrubber's normalisation: the same values it would redact (too-short values never count).
    for value in Scrubber(list(values)).values:
        forms.add(value.encode("utf-8"))
        forms.add(json.dumps(value, ensure_ascii=False)[1:-1].encode("utf-8"))
        forms.add(json.dumps(value)[1:-1].encode("utf-8"))
    if not forms:
        return None
    return re.compile(b"|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def count_secret_leaks(run_dir: RunDir | str | Path, values: Iterable[str]) -> dict[str, Any]:
    """``{"secret_values_checked", "secret_leaks", "secret_leaks_by_folder"}`` for a run folder."""
    run_dir = RunDir.of(run_dir)
    distinct = Scrubber(list(values)).values
    pattern = _pattern(distinct)
    by_folder: dict[str, int] = {}
    if pattern is not None:
        for entry in sorted(run_dir.all_files(), key=lambda e: e.path):
            if entry.name.endswith(_SKIPPED_SUFFIXES):
                continue
            found = 0
            with run_dir.open_stream(entry.path) as handle:
                for line in handle:
                    found += sum(1 for _ in pattern.finditer(line))
            if found:
                parts = run_dir.relative(entry.path).split("/")
                group = parts[0] if len(parts) > 1 else "(run folder)"
                by_folder[group] = by_folder.get(group, 0) + found
    return {
        "secret_values_checked": len(distinct),
        "secret_leaks": sum(by_folder.values()),
        "secret_leaks_by_folder": dict(sorted(by_folder.items())),
    }
