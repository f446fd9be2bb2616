"""Keep secrets out of trajectories: any occurrence of a secret value is replaced before it is stored.

Secret values are the API key and the values of environment variables the run marks secret. Tool output
is scrubbed before the model sees it (so a model cannot echo a key back into later turns), and the
finished record is scrubbed once more as a whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from raygen.formats.records import Trajectory

REDACTED = "[REDACTED]"
_MIN_SECRET_LEN = 6  # shorter values would redact ordinary words

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def looks_secret(name: str) -> bool:
    """True for variable names that usually hold credentials (``OPENAI_API_KEY``, ``GH_TOKEN``, ...)."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


class Scrubber:
    def __init__(self, values: list[str]):
        self.values = sorted({v for v in values if v and len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def scrub_record(self, record: Trajectory) -> Trajectory:
        if not self.values:
            return record
        blob = record.model_dump_json()
        # Values are searched in their JSON-escaped form, which is how they appear inside the dump.
        escaped = [json.dumps(v, ensure_ascii=False)[1:-1] for v in self.values]
        if not any(e in blob for e in escaped):
            return record
        for e in escaped:
            blob = blob.replace(e, REDACTED)
        return Trajectory.model_validate_json(blob)


def worker_secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of this process's variables named like credentials (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
    ...; see ``raygen.formats.scrub.looks_secret``): redacted like the API key wherever a session runs."""
    environ = os.environ if environ is None else environ
    return [value for name, value in environ.items() if value and looks_secret(name)]
