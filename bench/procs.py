"""CPU and memory of a whole process tree, from /proc (no psutil).

``TreeSampler`` follows a root process and every descendant it ever had (Ray's gcs/raylet/workers, shell
commands), every ``every_s``: the tree's CPU seconds so far and the sum of its resident set sizes. A
process is known by (pid, start time), so pid reuse cannot mix two processes, and a descendant that was
re-parented (its parent died first) is still counted.

With ``mark``, a process also belongs when its environment holds ``RAYGEN_BENCH_MARK=<mark>`` (read once
per process): the "whole machine" accounting of issue 24, which finds every process of one run wherever
it sits (Ray's daemons and workers, anything re-parented away) but not the simulator, started unmarked.
Each sample then also records the machine's busy CPU from /proc/stat (all processes, others' too).

CPU of short-lived processes that were never sampled (e.g. one shell command per session) is not lost:
it reaches the parent's ``cutime``/``cstime`` when the parent reaps them. To avoid counting a *sampled*
child twice, a parent's child time is reduced by the last-seen time of the sampled children it outlived.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from dataclasses import dataclass, field

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class _Proc:
    pid: int
    ppid: int
    start: int
    """Start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    self_s: float = 0.0
    children_s: float = 0.0
    rss: int = 0
    last_seen: float = 0.0
    dead_at: float | None = None
    name: str = ""


@dataclass
class Sample:
    t: float
    """time.time() of the sample."""
    cpu_s: float
    """CPU seconds the tree used since the sampler started (all its processes, living and dead)."""
    rss: int
    """Sum of the resident set sizes of the living processes, in bytes."""
    procs: int
    pss: int = 0
    """Sum of proportional set sizes (shared pages split between their users), when sampled."""
    machine_busy_s: float = 0.0
    """Busy CPU seconds of the whole machine since boot (/proc/stat), when the sampler has a ``mark``."""


MARK_ENV = "RAYGEN_BENCH_MARK"


def _has_mark(pid: int, mark: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARK_ENV}={mark}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _machine_busy_s() -> float:
    """All CPUs' busy seconds since boot: every field of /proc/stat's cpu line but idle and iowait."""
    with open("/proc/stat", "rb") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def _read_pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _read_stat(pid: int) -> tuple[int, int, str, float, float, int] | None:
    """(ppid, start ticks, comm, self CPU s, reaped children CPU s, rss bytes) or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lpar, rpar = data.find("("), data.rfind(")")
    comm = data[lpar + 1 : rpar]
    fields = data[rpar + 2 :].split()
    # fields[0] is field 3 (state): field N is fields[N - 3]
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    start = int(fields[19])
    rss_pages = int(fields[21])
    return ppid, start, comm, (utime + stime) / _TICK, (cutime + cstime) / _TICK, rss_pages * _PAGE


def _parent_of(proc: _Proc, by_pid: dict[int, list[_Proc]]) -> _Proc | None:
    """The process that was ``proc``'s parent when first seen (the newest one with that pid that is older)."""
    candidates = [p for p in by_pid.get(proc.ppid, ()) if p.start <= proc.start]
    return max(candidates, key=lambda p: p.start, default=None)


@dataclass
class TreeSampler:
    """Samples the tree under ``root`` on a thread until ``stop()``; use as a context manager."""

    root: int
    every_s: float = 0.5
    pss: bool = False
    """Also sum PSS, every ``pss_every``-th sample (a page-table walk per process: costly CPU)."""
    pss_every: int = 4
    mark: str | None = None
    """Also count every process whose environment carries this mark (``MARK_ENV``), wherever it sits."""
    samples: list[Sample] = field(default_factory=list)
    peak_breakdown: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(processes, RSS) by process name at the sample with the highest total RSS."""
    _procs: dict[tuple[int, int], _Proc] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _baseline_s: float | None = None
    _unmarked: set[tuple[int, int]] = field(default_factory=set)

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> Sample:
        now = time.time()
        alive: dict[int, tuple[int, int, str, float, float, int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := _read_stat(int(entry))) is not None:
                alive[int(entry)] = st
        known_pids = {key[0]: key for key, p in self._procs.items() if p.dead_at is None}
        # a process belongs to the tree if it is the root or its parent does (parents come first in
        # creation order, so a few passes settle chains born between two samples)
        for _ in range(4):
            added = False
            for pid, (ppid, start, comm, *_rest) in alive.items():
                key = (pid, start)
                if key in self._procs:
                    continue
                if pid == self.root or ppid in known_pids or self._marked(pid, start):
                    self._procs[key] = _Proc(pid, ppid, start, name=comm)
                    known_pids[pid] = key
                    added = True
            if not added:
                break
        rss = procs = pss = 0
        with_pss = self.pss and len(self.samples) % self.pss_every == 0
        breakdown: dict[str, tuple[int, int]] = {}
        for proc in self._procs.values():
            st = alive.get(proc.pid)
            if st is not None and st[1] == proc.start:
                _, _, proc.name, proc.self_s, proc.children_s, proc.rss = st
                proc.last_seen = now
                rss += proc.rss
                procs += 1
                count, total = breakdown.get(proc.name, (0, 0))
                breakdown[proc.name] = (count + 1, total + proc.rss)
                if with_pss:
                    pss += _read_pss(proc.pid)
            elif proc.dead_at is None:
                proc.dead_at = now
                proc.rss = 0
        cpu = self._cpu_total()
        if self._baseline_s is None:
            self._baseline_s = cpu
        sample = Sample(now, cpu - self._baseline_s, rss, procs, pss)
        if self.mark is not None:
            sample.machine_busy_s = _machine_busy_s()
        if rss > self.peak_rss:
            self.peak_breakdown = breakdown
        self.samples.append(sample)
        return sample

    def _marked(self, pid: int, start: int) -> bool:
        if self.mark is None or (pid, start) in self._unmarked:
            return False
        if _has_mark(pid, self.mark):
            return True
        self._unmarked.add((pid, start))
        return False

    def _cpu_total(self) -> float:
        total = 0.0
        outlived: dict[int, float] = {}
        by_pid: dict[int, list[_Proc]] = {}
        for proc in self._procs.values():
            by_pid.setdefault(proc.pid, []).append(proc)
        for proc in self._procs.values():
            total += proc.self_s
            parent = _parent_of(proc, by_pid)
            if parent is not None and proc.dead_at is not None and parent.last_seen >= proc.dead_at:
                outlived[id(parent)] = outlived.get(id(parent), 0.0) + proc.self_s
        for proc in self._procs.values():
            total += max(0.0, proc.children_s - outlived.get(id(proc), 0.0))
        return total

    # ------------------------------------------------------------------ results

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def peak_pss(self) -> int:
        return max((s.pss for s in self.samples), default=0)

    @property
    def cpu_s(self) -> float:
        return self.samples[-1].cpu_s if self.samples else 0.0

    def cpu_between(self, t0: float, t1: float) -> float:
        """CPU seconds the tree used between two times (linear between samples)."""
        return self._cpu_at(t1) - self._cpu_at(t0)

    def machine_busy_between(self, t0: float, t1: float) -> float:
        """Busy CPU seconds of the whole machine between two times (nearest samples inside the span)."""
        inside = [s for s in self.samples if t0 <= s.t <= t1 and s.machine_busy_s]
        if len(inside) < 2 or inside[-1].t <= inside[0].t:
            return 0.0
        rate = (inside[-1].machine_busy_s - inside[0].machine_busy_s) / (inside[-1].t - inside[0].t)
        return rate * (t1 - t0)

    def peak_rss_between(self, t0: float, t1: float) -> int:
        return max((s.rss for s in self.samples if t0 <= s.t <= t1), default=self.peak_rss)

    def _cpu_at(self, t: float) -> float:
        s = self.samples
        if not s:
            return 0.0
        if t <= s[0].t:
            return s[0].cpu_s
        for a, b in itertools.pairwise(s):
            if a.t <= t <= b.t:
                span = b.t - a.t
                return a.cpu_s + (b.cpu_s - a.cpu_s) * ((t - a.t) / span if span > 0 else 1.0)
        return s[-1].cpu_s

    def kill_all(self, sig: int) -> None:
        """Send ``sig`` to every process of the tree still alive (Ray starts workers in their own process
        groups, so killing the root's group is not enough)."""
        self.sample()
        for proc in self._procs.values():
            if proc.dead_at is None:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, sig)

    def describe_peak(self, top: int = 5) -> str:
        """The largest process kinds at peak RSS, e.g. ``ray::MapWorker( x8 1.55 GiB``."""
        items = sorted(self.peak_breakdown.items(), key=lambda kv: -kv[1][1])[:top]
        return ", ".join(f"{name} x{count} {rss / 2**30:.2f}" for name, (count, rss) in items)

    def cpu_by_name(self) -> dict[str, float]:
        """CPU seconds by process name over the sampler's life (own time only, for diagnostics)."""
        out: dict[str, float] = {}
        for proc in self._procs.values():
            out[proc.name] = out.get(proc.name, 0.0) + proc.self_s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def names(self) -> dict[str, int]:
        """Process names seen (for the report): name -> count."""
        out: dict[str, int] = {}
        for proc in self._procs.values():
            out[proc.name] = out.get(proc.name, 0) + 1
        return out
