"""``raygen export``: a finished run's records as the files training frameworks load (docs/exports.md)."""
