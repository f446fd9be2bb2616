"""The ``raygen`` command: every typer and rich line of the package lives here (see README.md).

``app`` is the entry point (``raygen = "raygen.cli:app"``); ``python -m raygen.cli`` runs it too.
"""

from raygen.cli.main import app

__all__ = ["app"]
