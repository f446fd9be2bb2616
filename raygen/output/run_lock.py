"""One driver per run: ``RUN_DIR/driver.lock`` names the driver that holds the run folder.

Two drivers on one run folder resend prompts to the model and delete each other's files, so a driver
takes the lock before it reads the ledger and holds it until its last write. The lock is a small JSON
document (host, pid, start time, Slurm job, a heartbeat refreshed every ``interval_s`` seconds). A lock
is *stale*, and taken over, when its holder is certainly gone:

- same host: the pid is not running (or is another process now: its start time differs);
- same Slurm job id (a requeued job): Slurm starts a requeued job only after its previous run ended;
- another host: no heartbeat for ``stale_after_s`` (default 6 heartbeats: 30 s; clocks of the
  hosts must agree to well within that).

Filesystems (local or shared: the file is created with ``O_EXCL``; a stale one is renamed away, which
only one taker can do) and object stores (no exclusive create through ``pyarrow.fs``: the taker writes
its lock, waits ``settle_s``, and reads it back; the later of two racing writers wins and the other
refuses; two takers whose check-to-write gaps differ by more than ``settle_s`` could both proceed, a
window documented in docs/resume.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from raygen.errors import ConfigError
from raygen.output.run_dir import LOCK_FILE, RunDir

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_HEARTBEATS = 6
_TAKEOVER_STALE_S = 10.0
"""A ``.takeover`` file older than this was left by a taker that died while replacing a stale lock."""


class RunLocked(ConfigError):
    """Another driver holds the run folder."""


@dataclass(frozen=True)
class Holder:
    """The content of ``driver.lock``."""

    host: str
    pid: int
    since: str
    """When the holder took the lock (UTC, ISO 8601)."""
    heartbeat: float
    """Unix time of the holder's latest heartbeat."""
    token: str
    pid_start: str | None = None
    """The pid's start time in clock ticks since boot (Linux), so a reused pid is not mistaken for it."""
    slurm_job: str | None = None
    command: str = "run"
    """The ``raygen`` command holding the run: ``run`` (a driver), ``merge`` or ``rescore``."""

    @property
    def what(self) -> str:
        return "raygen driver" if self.command == "run" else f"raygen {self.command}"

    def describe(self, now: float | None = None) -> str:
        age = (now if now is not None else time.time()) - self.heartbeat
        job = f", Slurm job {self.slurm_job}" if self.slurm_job else ""
        return f"host {self.host} pid {self.pid}{job} since {self.since} (heartbeat {age:.0f} s ago)"

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=2) + "\n").encode("utf-8")

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        try:
            body = json.loads(data)
            return cls(**{k: body[k] for k in cls.__dataclass_fields__ if k in body})
        except (ValueError, TypeError, KeyError):
            return None


def _pid_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            # Field 22 counts from after the parenthesised command name, which may hold spaces.
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return start is None or _pid_start(pid) in (None, start)


class RunLock:
    """Holds ``driver.lock`` of one run folder; use as a context manager (``hold``)."""

    def __init__(
        self,
        run_dir: RunDir,
        interval_s: float = HEARTBEAT_S,
        stale_after_s: float | None = None,
        settle_s: float = 1.0,
        command: str = "run",
    ):
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else STALE_HEARTBEATS * interval_s
        self.settle_s = settle_s
        self.path = run_dir.path(LOCK_FILE)
        pid = os.getpid()
        self.holder = Holder(
            host=socket.gethostname(),
            pid=pid,
            since=datetime.now(UTC).isoformat(timespec="seconds"),
            heartbeat=time.time(),
            token=uuid.uuid4().hex,
            pid_start=_pid_start(pid),
            slurm_job=os.environ.get("SLURM_JOB_ID"),
            command=command,
        )
        self.taken_over: Holder | None = None
        """The stale holder this lock replaced, if any."""
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what a lock says about its holder -------------------------------------------------------------

    def is_stale(self, other: Holder, now: float | None = None) -> bool:
        """Whether ``other`` certainly no longer runs (see the module docstring)."""
        me = self.holder
        if other.host == me.host:
            if other.pid == me.pid and other.token != me.token:
                return True  # an earlier run in this very process that ended without releasing
            return not _pid_alive(other.pid, other.pid_start)
        if me.slurm_job and other.slurm_job == me.slurm_job:
            return True
        return (now if now is not None else time.time()) - other.heartbeat > self.stale_after_s

    def read(self) -> Holder | None:
        try:
            data = self.run_dir.storage.read_bytes(self.path)
        except FileNotFoundError:
            return None
        holder = Holder.parse(data)
        if holder is None:  # torn or foreign content: treat as a holder that died mid-write
            return Holder(host="?", pid=0, since="?", heartbeat=0.0, token="?")
        return holder

    # -- acquire / heartbeat / release --------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; ``RunLocked`` naming a live holder."""
        take = self._acquire_file if self.run_dir.is_local else self._acquire_object
        for _ in range(5):
            if take():
                return
            time.sleep(0.05)  # the lock vanished or changed between two steps: look again
        raise RunLocked(f"{self.run_dir}: could not take {LOCK_FILE} (it keeps changing); try again")

    def _refuse_unless_stale(self, current: Holder) -> None:
        if not self.is_stale(current):
            raise RunLocked(
                f"{self.run_dir} is in use by another {current.what}: {current.describe()}; wait for it "
                f"to finish, or stop it (a killed {current.what}'s lock is taken over automatically)"
            )
        self.taken_over = current

    def _acquire_file(self) -> bool:
        self.run_dir.create()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            current = self.read()
            if current is None:
                return False
            self._refuse_unless_stale(current)
            return self._take_over(current)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.holder.to_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def _take_over(self, stale: Holder) -> bool:
        """Replace the stale lock ``stale``, one taker at a time.

        Under an exclusive ``<lock>.takeover`` file, the lock is replaced (a rename over it, atomic) only
        if it still holds ``stale``'s token: a taker that read the same stale lock a moment later finds
        the new holder there and is refused. (Moving the stale file aside instead let a slow taker move
        a fresh lock aside too, and two drivers held the run.)"""
        guard = f"{self.path}.takeover"
        try:
            os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - os.stat(guard).st_mtime > _TAKEOVER_STALE_S:
                    os.unlink(guard)  # left by a taker that died in the middle
            return False
        try:
            again = self.read()
            if again is None or again.token != stale.token:
                self.taken_over = None
                return False
            self.run_dir.storage.put(self.path, [self.holder.to_bytes()])  # temp, fsync, rename over it
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(guard)

    def _acquire_object(self) -> bool:
        current = self.read()
        if current is not None:
            self._refuse_unless_stale(current)
        self.run_dir.storage.put(self.path, [self.holder.to_bytes()])
        time.sleep(self.settle_s)  # a racing writer's put lands within this; the later one wins
        won = self.read()
        if won is not None and won.token != self.holder.token:
            self._refuse_unless_stale(won)
            return False
        return won is not None

    def beat(self) -> None:
        """Refresh the heartbeat, unless the lock is no longer ours (then ``lost`` is set)."""
        current = self.read()
        if current is None or current.token != self.holder.token:
            if not self.lost:
                log.error(
                    "%s: this driver no longer holds %s (taken by %s)", self.run_dir, LOCK_FILE, current
                )
            self.lost = True
            return
        fresh = Holder(**{**asdict(self.holder), "heartbeat": time.time()})
        self.run_dir.storage.put(self.path, [fresh.to_bytes()])  # atomic replace / one put
        self.holder = fresh

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError as exc:  # storage briefly unreachable: the next beat tries again
                log.warning("%s: heartbeat not written: %s", self.run_dir, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        with contextlib.suppress(OSError):
            current = self.read()
            if current is not None and current.token == self.holder.token:
                self.run_dir.storage.delete(self.path)

    @contextlib.contextmanager
    def hold(self) -> Iterator[RunLock]:
        self.acquire()
        self._thread = threading.Thread(target=self._beat_forever, name="raygen-run-lock", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self.release()


def lock_status(run_dir: RunDir) -> tuple[Holder, bool] | None:
    """The holder named by the run's lock and whether it is still running, or None without a lock."""
    probe = RunLock(run_dir)
    holder = probe.read()
    return None if holder is None else (holder, not probe.is_stale(holder))
