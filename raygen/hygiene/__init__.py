"""Data hygiene before launch: secrets and personal data in prompts, overlap with an evaluation set, and
the run-level count of secret values that reached the output. See docs/hygiene.md."""

from raygen.hygiene.leaks import count_secret_leaks, host_secret_values
from raygen.hygiene.scan import HygieneFinding, HygieneReport, HygieneScan, OverlapFinding, scan_hygiene

__all__ = [
    "HygieneFinding",
    "HygieneReport",
    "HygieneScan",
    "OverlapFinding",
    "count_secret_leaks",
    "host_secret_values",
    "scan_hygiene",
]
