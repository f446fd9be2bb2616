"""What a bubblewrap sandbox of the local backend shows, and the file tools' view of the same.

Only what commands need is mounted: the system folders read-only (``/usr``, ``/bin``, ``/sbin``,
``/lib*``), a list of harmless ``/etc`` entries (users and groups without ``shadow``, name resolution,
the dynamic linker's cache, certificates, shell start-up files; never ``ssh/``, ``ssl/private``,
``sudoers``, ``munge``, ``docker``, ``pip.conf`` or ``npmrc``), ``env.bwrap_ro_binds``, fresh ``/dev``
and ``/proc``, the session's ``tmp/`` as ``/tmp`` and its workdir (HOME is its ``home/``). Nothing else
of the host exists inside: not ``/root``, ``/home``, ``/srv``, ``/var``, ``/opt`` or ``/work``.

``readable`` answers, for the file tools, whether a host path is one of those read-only mounts, so
``read_file`` sees what ``cat`` in the sandbox would see (docs/backends.md).
"""

from __future__ import annotations

import functools
import glob
import os
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_ALLOWED = (
    "passwd", "group", "nsswitch.conf", "host.conf", "hosts", "hostname", "resolv.conf", "gai.conf",
    "protocols", "services", "networks", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
    "localtime", "timezone", "locale.alias", "locale.conf", "locale.gen", "default/locale", "environment",
    "bash.bashrc", "profile", "profile.d", "inputrc", "shells", "login.defs", "terminfo", "mime.types",
    "magic", "magic.mime", "mailcap", "os-release", "lsb-release", "debian_version", "alpine-release",
    "redhat-release", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
    "pki/tls/certs", "pki/ca-trust", "python3*", "perl", "vim", "fonts", "xdg", "java-*", "manpath.config",
)  # fmt: skip
"""``/etc`` entries (globs) bound read-only; everything else in ``/etc`` is absent in the sandbox."""


def _mount(path: str) -> list[str]:
    # A symlink stays a symlink (merged /usr: /bin -> usr/bin), so paths resolve as on the host.
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    return ["--ro-bind", path, path]


@functools.cache
def _host_mounts(extra: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(bwrap arguments, the real host folders/files they show), computed once per process."""
    args: list[str] = []
    shown: list[str] = []
    etc = [match for pattern in ETC_ALLOWED for match in sorted(glob.glob(f"/etc/{pattern}"))]
    for path in (*SYSTEM_DIRS, *etc, *extra):
        if os.path.lexists(path):
            args += _mount(path)
            shown.append(os.path.realpath(path))
    return tuple(args), tuple(shown)


def sandbox_argv(
    bwrap: str,
    workdir: str,
    cwd: str,
    flags: tuple[str, ...],
    extra: tuple[str, ...],
    binds: tuple[str, ...] = (),
) -> list[str]:
    """The bwrap command line that runs what follows ``--`` in the session's sandbox; ``binds`` are host
    folders shown writable at the same path (``EnvSpec.binds``)."""
    mounts, _ = _host_mounts(extra)
    writable = [arg for path in binds for arg in ("--bind", path, path)]
    # /tmp is the session's own: read-only extras under it (a harness's venv) go on top of it.
    in_tmp = [a for p in extra if p.startswith("/tmp/") and os.path.lexists(p) for a in ("--ro-bind", p, p)]
    # Order matters: later mounts win, so the workdir stays visible even when it lives under /tmp.
    return [
        bwrap,
        *mounts,
        "--dev", "/dev",
        "--proc", "/proc",
        "--bind", f"{workdir}/tmp", "/tmp",
        *in_tmp,
        "--bind", workdir, workdir,
        *writable,
        *flags,
        "--chdir", cwd,
        "--",
    ]  # fmt: skip


def readable(resolved: Path, extra: tuple[str, ...]) -> bool:
    """True if the sandbox shows this host path (symlinks already resolved) read-only."""
    _, shown = _host_mounts(extra)
    return any(resolved.is_relative_to(root) for root in shown)
