"""Stand-in for Modal's ``/__modal/.bin/modal-sandbox-fs-tools``, run as a real process by the fake.

Usage: ``python fs_tools.py ROOTFS COMMAND_JSON``. ``COMMAND_JSON`` is what the SDK sends (see
``modal/_utils/sandbox_fs_utils.py``: ``{"ReadFile": {"path": ...}}``, ``{"WriteFile": ...}`` with the
content on stdin, ``{"MakeDirectory": {"path": ..., "parents": ...}}``). Sandbox paths are absolute and
taken inside ROOTFS, the sandbox's root. Errors go to stderr as the JSON payload the SDK parses
(``{"error_kind": ..., "message": ...}``) with exit code 1. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import sys


class FsToolError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(kind, message)
        self.kind, self.message = kind, message


_ERRNO_KINDS = {
    errno.ENOENT: ("NotFound", "No such file or directory"),
    errno.EISDIR: ("IsDirectory", "Is a directory"),
    errno.ENOTDIR: ("NotDirectory", "Not a directory"),
    errno.EACCES: ("PermissionDenied", "Permission denied"),
    errno.EPERM: ("PermissionDenied", "Operation not permitted"),
    errno.EEXIST: ("PathAlreadyExists", "File exists"),
}


def host_path(rootfs: str, sandbox_path: str) -> str:
    """The host path of an absolute sandbox path (``..`` cannot climb out of the root)."""
    return os.path.join(rootfs, posixpath.normpath("/" + sandbox_path).lstrip("/"))


def read_file(path: str) -> None:
    if os.path.isdir(path):
        raise FsToolError("IsDirectory", "Is a directory")
    with open(path, "rb") as handle:
        shutil.copyfileobj(handle, sys.stdout.buffer)
    sys.stdout.buffer.flush()


def write_file(path: str) -> None:
    if os.path.isdir(path):
        raise FsToolError("IsDirectory", "Is a directory")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except FileExistsError as exc:  # a parent is a file: the real tool says AlreadyExists here
        raise FsToolError("AlreadyExists", "File exists") from exc
    with open(path, "wb") as handle:
        shutil.copyfileobj(sys.stdin.buffer, handle)


def make_directory(path: str, parents: bool) -> None:
    if parents:
        if os.path.exists(path) and not os.path.isdir(path):
            raise FsToolError("NotDirectory", "Not a directory")
        os.makedirs(path, exist_ok=True)
    else:
        os.mkdir(path)


def main(argv: list[str]) -> int:
    rootfs, command = argv[1], json.loads(argv[2])
    (name, args), *_ = command.items()
    path = host_path(rootfs, args["path"])
    try:
        if name == "ReadFile":
            read_file(path)
        elif name == "WriteFile":
            write_file(path)
        elif name == "MakeDirectory":
            make_directory(path, bool(args.get("parents")))
        else:
            raise FsToolError("Unsupported", f"the fake fs-tools does not implement {name}")
    except FsToolError as exc:
        kind, message = exc.kind, exc.message
    except OSError as exc:
        kind, message = _ERRNO_KINDS.get(exc.errno, ("Io", exc.strerror or str(exc)))
    else:
        return 0
    sys.stderr.write(json.dumps({"error_kind": kind, "message": message}))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
