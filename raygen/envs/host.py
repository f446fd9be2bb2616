"""What the backends that keep a session's files in a host folder share (local, singularity): removing a
workdir whatever its commands left in it (which host variable names hold credentials: formats/scrub.py)."""

from __future__ import annotations

import functools
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path


def _make_dirs_writable(top: Path) -> None:
    # Commands may leave read-only directories (chmod -w, tools' caches); a non-root owner can only
    # delete their entries after making them writable again. Symlinks are never followed.
    def allow(path: str) -> None:
        with suppress(OSError):
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)

    allow(str(top))
    for parent, dirs, _files in os.walk(top):
        for name in dirs:
            allow(os.path.join(parent, name))


def make_workdir(parent: str | os.PathLike, prefix: str, subdirs: Iterable[str]) -> Path:
    """A fresh session workdir ``<parent>/<prefix>XXXX`` (symlinks in ``parent`` resolved) holding empty
    ``subdirs``; ``OSError`` if it cannot be made."""
    try:
        workdir = tempfile.mkdtemp(prefix=prefix, dir=_real_parent(str(parent)))
    except FileNotFoundError:  # the parent was removed since this process first made it
        _real_parent.cache_clear()
        workdir = tempfile.mkdtemp(prefix=prefix, dir=_real_parent(str(parent)))
    try:
        for sub in subdirs:
            os.mkdir(os.path.join(workdir, sub))
    except OSError:
        shutil.rmtree(workdir, ignore_errors=True)  # the caller gets no workdir to close
        raise
    return Path(workdir)


@functools.lru_cache(maxsize=16)
def _real_parent(parent: str) -> str:
    """The workdirs' parent folder, created if missing and with symlinks resolved (``/tmp`` may be one):
    once per worker process, not once per session (``resolve`` is a system call per path component)."""
    os.makedirs(parent, exist_ok=True)
    return os.path.realpath(parent)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def remove_small_tree(path: Path, max_entries: int = 64) -> bool | None:
    """``remove_tree`` for a tree of at most ``max_entries`` entries: True once it is gone; ``None``
    when it is larger or an entry resists (a read-only directory), with what is left for ``remove_tree``
    in a thread. Meant to run on an event loop: a small tree goes in a fraction of a millisecond, while a
    thread hop costs tens of milliseconds on a busy loop (each of the thread's syscalls waits for the GIL
    again). One pass over directory file descriptors, symlinks never followed: ``shutil.rmtree`` plus
    making directories writable walked the tree three times (about 1 ms of a session actor's CPU per
    session, a tenth of its share, for the four directories of an empty workdir)."""
    budget = [max_entries]
    try:
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        return None
    try:
        if not _clear(top, budget):
            return None
    except OSError:  # one attempt: remove_tree's retries sleep, which must not happen on a loop
        return None
    finally:
        os.close(top)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return True


def _clear(fd: int, budget: list[int]) -> bool:
    """Remove what the directory open as ``fd`` holds; False (and stop) once ``budget`` entries are used."""
    with os.scandir(fd) as entries:
        found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in found:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if is_dir:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                if not _clear(sub, budget):
                    return False
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    return True


def remove_tree(path: Path) -> bool:
    """Delete a session workdir whatever commands left in it; True when it is gone."""
    for attempt in range(3):
        try:
            _make_dirs_writable(path)
            shutil.rmtree(path)
            return True
        except FileNotFoundError:
            return not path.exists()
        except OSError:
            # A just-killed process may still be finishing a write; try again shortly.
            time.sleep(0.1 * (attempt + 1))
    return not path.exists()
