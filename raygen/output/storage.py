"""Where a run folder's bytes live: a POSIX filesystem (local disk, or a shared one: Lustre, GPFS, NFS) or
an object store (``s3://``, ``gs://``) through ``pyarrow.fs``. ``RunDir`` (run_dir.py) is the only user.

Both keep one promise: a file appears whole or not at all, and is never modified after. On a filesystem
that is temp file + fsync + ``os.replace`` + directory fsync; on an object store (no rename, no append)
each file is written as one object, and a put is atomic. Credentials are never taken from the location:
pyarrow reads the provider's own environment and config (``AWS_*`` variables, ``~/.aws``, instance
metadata; ``GOOGLE_APPLICATION_CREDENTIALS`` ...), so they never reach a manifest or a message.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from raygen.errors import ConfigError

log = logging.getLogger(__name__)

OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs")
TMP_SUFFIX = ".tmp"
WRITE_RETRY_S = 60.0
"""Default of ``output.storage_retry_s``: how long an object-store write retries an unreachable store."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(OSError):
    """A run folder on an object store could not be read or written; the message is one line."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One file: its storage path, name, modification time (ns) and size."""

    path: str
    name: str
    mtime_ns: int
    size: int


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames/creations inside ``path`` durable (a no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_object_store(location: str | os.PathLike) -> bool:
    match = _SCHEME.match(str(location))
    return match is not None and match.group(1).lower() in OBJECT_STORE_SCHEMES


def open_storage(location: str | os.PathLike) -> tuple[Storage, str]:
    """The storage holding ``location`` and the location's path inside it."""
    text = os.fspath(location)
    match = _SCHEME.match(text)
    if match is None or match.group(1).lower() == "file":
        return LocalStorage(), text[len("file://") :] if match else text
    if match.group(1).lower() not in OBJECT_STORE_SCHEMES:
        raise ConfigError(
            f"{text}: unsupported storage scheme {match.group(1)!r} (use a path, s3:// or gs://)"
        )
    if "@" in text.split("/", 3)[2]:
        raise ConfigError(
            f"{_redact(text)}: credentials in the URI are refused; set them in the provider's environment "
            "or config (AWS_ACCESS_KEY_ID / ~/.aws, GOOGLE_APPLICATION_CREDENTIALS)"
        )
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{text}: {_one_line(exc)}") from exc
    return ObjectStorage(fs, text), path.rstrip("/")


def _redact(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def _one_line(exc: BaseException) -> str:
    """The useful part of an Arrow/AWS error: first line, without the request id."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s*\(Request ID: [^)]*\)", "", text)


class Storage:
    """The operations a run folder needs; paths are storage paths (``str``)."""

    local = False
    retry_s = 0.0

    def check(self, root: str) -> None:
        """``ConfigError`` when the storage holding ``root`` cannot be used at all (checked once, early)."""

    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p)

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def list(self, directory: str, *, recursive: bool = False) -> list[Entry]:
        """Files under ``directory`` (none when it does not exist), unordered."""
        raise NotImplementedError

    def read_bytes(self, path: str) -> bytes:
        raise NotImplementedError

    def open_stream(self, path: str) -> IO[bytes]:
        """A file to read sequentially."""
        raise NotImplementedError

    def open_seekable(self, path: str) -> IO[bytes]:
        """A file to read at any position."""
        raise NotImplementedError

    def put(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write a whole file atomically: readers see it complete or not at all."""
        raise NotImplementedError

    def put_file(self, path: str, local_file: Path) -> None:
        """``put`` the content of a local file."""
        raise NotImplementedError

    def delete(self, path: str) -> None:
        """Remove one file (missing is fine)."""
        raise NotImplementedError

    def upload_tree(self, local_dir: Path, directory: str) -> None:
        """Make ``directory`` hold exactly the files of ``local_dir`` (one level)."""
        raise NotImplementedError


class LocalStorage(Storage):
    """A POSIX filesystem: local disk or a shared one mounted on every node."""

    local = True

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list(self, directory: str, *, recursive: bool = False) -> list[Entry]:
        if not os.path.isdir(directory):
            return []
        found = []
        for entry in os.scandir(directory):
            if entry.is_dir() and recursive:
                found += self.list(entry.path, recursive=True)
            elif entry.is_file():
                stat = entry.stat()
                found.append(Entry(entry.path, entry.name, stat.st_mtime_ns, stat.st_size))
        return found

    def read_bytes(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def open_stream(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    open_seekable = open_stream

    def put(self, path: str, chunks: Iterable[bytes]) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        # A temp name of its own: two writers of one file (a lock's holder and a taker) never collide.
        tmp = f"{path}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(directory)

    def delete(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)


_WHOLE_OBJECT_BYTES = 8 << 20
# Errors no wait can fix (a deleted or misspelt bucket, refused credentials): reported at once.
_PERMANENT = re.compile(r"NO_SUCH_BUCKET|ACCESS_DENIED|INVALID_ACCESS_KEY|SIGNATURE_DOES_NOT_MATCH", re.I)


class _RawArrowStream(io.RawIOBase):
    """A pyarrow input stream as a Python raw stream, so ``io.BufferedReader`` can iterate its lines."""

    def __init__(self, stream: Any):
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


class ObjectStorage(Storage):
    """An object store through ``pyarrow.fs``: no rename and no append, so every file is one put."""

    def __init__(self, fs: Any, uri: str):
        self.fs = fs
        self.uri = uri
        self.retry_s = WRITE_RETRY_S

    def check(self, root: str) -> None:
        import pyarrow.fs as pafs

        bucket = root.split("/", 1)[0]
        if self._call("read", bucket, self.fs.get_file_info, bucket).type == pafs.FileType.NotFound:
            raise ConfigError(
                f"{self.uri}: bucket {bucket!r} does not exist (or these credentials cannot see it)"
            )

    def _call(self, what: str, path: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "NO_SUCH_KEY" in str(exc) or "Path does not exist" in str(exc):
                raise FileNotFoundError(f"{path}: not found") from exc
            raise StorageError(f"{self.uri}: cannot {what} {path}: {_one_line(exc)}") from exc

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        info = self._call("read", path, self.fs.get_file_info, path)
        return info.type != pafs.FileType.NotFound

    def list(self, directory: str, *, recursive: bool = False) -> list[Entry]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=recursive)
        infos = self._call("list", directory, self.fs.get_file_info, selector)
        return [
            Entry(i.path, i.base_name, i.mtime_ns or 0, i.size or 0)
            for i in infos
            if i.type == pafs.FileType.File
        ]

    def read_bytes(self, path: str) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(path) as fh:
                return fh.readall()

        return self._call("read", path, read)

    def open_stream(self, path: str) -> IO[bytes]:
        stream = self._call("read", path, self.fs.open_input_stream, path)
        return io.BufferedReader(_RawArrowStream(stream), buffer_size=1 << 20)

    def open_seekable(self, path: str) -> IO[bytes]:
        handle = self._call("read", path, self.fs.open_input_file, path)
        if handle.size() > _WHOLE_OBJECT_BYTES:
            return handle  # ranged GETs for the few records wanted from a big file
        # One GET for a small file (a shard): re-reading its records one by one costs no more requests.
        with handle:
            return io.BytesIO(self._call("read", path, handle.readall))

    def put(self, path: str, chunks: Iterable[bytes]) -> None:
        data = b"".join(chunks)
        self._retrying(path, lambda: [data])

    def put_file(self, path: str, local_file: Path) -> None:
        def chunks() -> Iterable[bytes]:
            with open(local_file, "rb") as fh:
                yield from iter(lambda: fh.read(1 << 22), b"")

        self._retrying(path, chunks)

    def _retrying(self, path: str, chunks: Any) -> None:
        # A put of a whole object can be repeated safely, so an unreachable store is waited for (with
        # backoff, up to retry_s): the records being written stay in memory meanwhile.
        deadline = time.monotonic() + self.retry_s
        delay = 0.5
        while True:
            try:
                return self._call("write", path, self._write_object, path, chunks())
            except StorageError as exc:
                if _PERMANENT.search(str(exc)) or time.monotonic() + delay > deadline:
                    raise
                log.warning("%s; retrying for up to %.0f s", exc, deadline - time.monotonic())
                time.sleep(delay)
                delay = min(delay * 2, 8.0)

    def _write_object(self, path: str, chunks: Iterable[bytes]) -> None:
        with self.fs.open_output_stream(path) as out:
            for chunk in chunks:
                out.write(chunk)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", path, self.fs.delete_file, path)

    def upload_tree(self, local_dir: Path, directory: str) -> None:
        # New files first, then the stale ones go: a reader may briefly see both, never neither.
        names = sorted(p.name for p in local_dir.iterdir() if p.is_file())
        for name in names:
            self.put_file(self.join(directory, name), local_dir / name)
        for entry in self.list(directory):
            if entry.name not in names:
                self.delete(entry.path)
