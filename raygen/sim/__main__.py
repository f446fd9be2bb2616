"""``python -m raygen.sim --config-json '{...}'``: serve the simulator until SIGTERM or SIGINT.

The first stdout line is ``RAYGEN_SIM_URL=<base url>`` (read by ``raygen.sim.launch.start_subprocess``);
nothing else is written to stdout.
"""

from __future__ import annotations

import argparse
import asyncio

from raygen.model.configs import SimConfig
from raygen.sim.server import URL_LINE_PREFIX, serve_forever


def _announce(url: str) -> None:
    print(f"{URL_LINE_PREFIX}{url}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and serve until a signal (or the parent given by --parent-pid is gone)."""
    parser = argparse.ArgumentParser(prog="python -m raygen.sim", description=__doc__)
    parser.add_argument("--config-json", default="{}", help="SimConfig as a JSON object")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)
    cfg = SimConfig.model_validate_json(args.config_json)
    asyncio.run(serve_forever(cfg, _announce, parent_pid=args.parent_pid))


if __name__ == "__main__":
    main()
