"""``python -m raygen.cli``: the ``raygen`` command."""

import sys

from raygen.cli.main import app

sys.exit(app())
