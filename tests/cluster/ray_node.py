"""The ``ray`` command for several Ray nodes on ONE machine over loopback (tests only; a real cluster needs
none of this).

With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` Ray keeps every address on loopback, but ``ray start --address``
then refuses ("Multi-node clusters are not supported on Windows and OSX"). This re-enables clustering in
this process only and keeps loopback addresses as given, then runs the ordinary CLI::

    python tests/cluster/ray_node.py start --address=127.0.0.1:6379 --node-ip-address=127.0.0.1 ...

``python tests/cluster/ray_node.py wait-nodes ADDRESS N TIMEOUT_S`` joins as a short-lived driver, waits
until N nodes are alive and prints them as JSON (node id, resources) on a line starting ``RAYGEN_NODES=``,
so tests need no Ray in-process.
Tests import ``free_port_block``, ``marked_processes``, ``wait_unmarked`` and ``kill_tagged`` from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path


def free_port_block(count: int) -> int:
    """First of ``count`` consecutive TCP ports free on 127.0.0.1 now (several clusters, other tests and
    other helpers share this machine, so fixed ports would collide)."""
    for _ in range(200):
        base = random.randrange(20_000, 40_000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


MARK_VARIABLE = "RAYGEN_TEST_MARK"
"""Tests put a unique value in this environment variable of what they start: every process spawned from
it inherits the variable, including Ray workers, which rewrite their command lines (``ray::IDLE``)."""


def marked_processes(mark: str) -> list[str]:
    """Live processes (pid: command line) whose environment has ``RAYGEN_TEST_MARK=<mark>``."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if cmdline:  # zombies have none: they are dead, only not yet reaped
            found.append(f"{proc.name}: {cmdline[:160]}")
    return found


def wait_unmarked(mark: str, timeout_s: float) -> list[str]:
    """The processes marked ``mark`` still alive after up to ``timeout_s`` (empty: all gone)."""
    deadline = time.monotonic() + timeout_s
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def kill_tagged(leader: int, tag: str) -> None:
    """SIGKILL process group ``leader``, its descendants and every process whose environment holds
    ``tag`` (``NAME=value``), pass after pass until none is left (a raylet may start a worker meanwhile;
    Ray runs workers in their own process groups, and one outlived its raylet by seconds under load)."""
    needle = tag.encode()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)
    for _ in range(20):
        parents: dict[int, int] = {}
        doomed: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] in ("Z", "X"):
                    continue  # dead already, only not reaped
                parents[int(entry.name)] = int(fields[1])
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    doomed.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
        frontier = [leader, *doomed]
        while frontier:
            children = [
                child for child, parent in parents.items() if parent in frontier and child not in doomed
            ]
            doomed.update(children)
            frontier = children
        doomed &= parents.keys()  # alive ones only
        if not doomed:
            return
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


NODES_PREFIX = "RAYGEN_NODES="
"""Prefix of the line ``wait-nodes`` prints its JSON on."""


def _loopback_cluster_cli() -> int:
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray.scripts.scripts import main

    ray_constants.ENABLE_RAY_CLUSTER = True
    services.resolve_ip_for_localhost = lambda host: host
    return main()


def _wait_nodes(address: str, want: int, timeout_s: float) -> int:
    import ray

    deadline = time.monotonic() + timeout_s
    while True:  # the head may still be starting: its GCS or its raylet not up yet
        try:
            ray.init(
                address=address, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR"
            )
            break
        except Exception:
            ray.shutdown()
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    try:
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= want or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        nodes = [{"node_id": n["NodeID"], "resources": n["Resources"]} for n in alive]
        print(NODES_PREFIX + json.dumps(nodes), flush=True)  # Ray may print its own lines too
        return 0 if len(alive) >= want else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["wait-nodes"]:
        sys.exit(_wait_nodes(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
    sys.argv[0] = "ray"
    sys.exit(_loopback_cluster_cli())
