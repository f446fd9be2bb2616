"""What the backends that keep a session's files in a host folder share (local, singularity): which host
variable names hold credentials, and removing a workdir whatever its commands left in it."""

from __future__ import annotations

import os
import shutil
import stat
import time
from contextlib import suppress
from pathlib import Path

SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def looks_secret(name: str) -> bool:
    """True for variable names that usually hold credentials (``OPENAI_API_KEY``, ``GH_TOKEN``, ...)."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


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


def remove_small_tree(path: Path, max_entries: int = 64) -> bool | None:
    """``remove_tree`` for a tree of at most ``max_entries`` entries; ``None`` (nothing removed) for a
    larger one. Meant to run on an event loop: a small tree goes in well under a millisecond, while a
    thread hop costs tens of milliseconds on a busy loop (each of the thread's syscalls waits for the
    GIL again). Larger trees go to a thread."""
    count, pending = 0, [str(path)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    count += 1
                    if count > max_entries:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except FileNotFoundError:
            continue
        except OSError:
            return None  # unreadable (chmod -r): remove_tree makes it readable first
    # One attempt: remove_tree's retries sleep, which must not happen on a loop.
    try:
        _make_dirs_writable(path)
        shutil.rmtree(path)
    except FileNotFoundError:
        return True if not path.exists() else None
    except OSError:
        return None
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
