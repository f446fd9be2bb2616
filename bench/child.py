"""``python -m bench.child CONFIG.yaml DATASET``: one ``raygen run`` through the library entry point
(``raygen.run.driver.run``, what the CLI calls), in its own process so its whole process tree can be measured.

The library path instead of the ``raygen`` command: the benchmark measures the run, not the CLI's
optional extension commands."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from raygen.cli.console import ConsoleReporter, summary_rows
from raygen.configfile import load_config
from raygen.run.driver import run


def main(argv: list[str]) -> int:
    config_path, dataset = Path(argv[0]), argv[1]
    config = load_config(config_path, {"dataset": dataset})
    result = run(config, reporter=ConsoleReporter(Console(stderr=True, width=120)))
    for name, value in summary_rows(result.merge.stats if result.merge else {}):
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
