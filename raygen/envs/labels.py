"""Labels (Docker) and tags (Modal) that every sandbox carries: the run and session it belongs to and the
process that owns it, so a backend's ``reap`` can find a killed run's leftovers and a human can tell whose
sandbox it is."""

from __future__ import annotations

LABEL_RUN = "raygen.run"
LABEL_SAMPLE = "raygen.sample"
LABEL_OWNER_PID = "raygen.owner_pid"
LABEL_OWNER_HOST = "raygen.owner_host"
