"""Write files so that a final name never holds a half-written file.

Everything goes to a temporary name in the same directory and is renamed into place only
after it was completely written (rename within a directory is atomic on POSIX).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plumbing.errors import RlcapError


def partial_path(path: str | os.PathLike) -> Path:
    """The temporary name used while `path` is being written."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, keep_partial: bool = False) -> Iterator[Path]:
    """Yield a temporary path; rename it to `path` when the block succeeds.

    On error the temporary file is removed, unless `keep_partial` is set (resumable writers
    keep it so that the next run can continue from it).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(final)
    if not keep_partial:  # a partial left by a crashed run (even a segfault) must not be read as ours
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    try:
        yield tmp
    except BaseException:
        if not keep_partial:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    os.replace(tmp, final)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with disk_full_names(path, len(data)), atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def to_json(obj: Any, indent: int | None = None) -> str:
    """JSON text that is always valid JSON: NaN or infinity is an error, never written."""
    try:
        return json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise RlcapError(f"refusing to write a non-finite number (NaN or infinity) as JSON: {exc}") from None


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> None:
    write_text(path, to_json(obj, indent) + "\n")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line and flush it to disk (JSON-lines logs such as metrics.jsonl). A last line
    cut short by an interrupted append (no newline, not JSON) is dropped first, so the new line
    stands alone; a whole record that only lacks its newline is kept."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    with disk_full_names(path, len(data)), open(path, "ab+") as fh:
        _drop_torn_tail(fh)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _drop_torn_tail(fh) -> None:
    size = fh.seek(0, os.SEEK_END)
    if size == 0:
        return
    fh.seek(size - 1)
    if fh.read(1) == b"\n":
        return
    fh.seek(0)  # only after a crash: reading the whole log is fine
    content = fh.read()
    cut = content.rfind(b"\n") + 1
    try:
        json.loads(content[cut:])
    except ValueError:
        fh.truncate(cut)
    else:
        fh.write(b"\n")


@contextlib.contextmanager
def disk_full_names(path: str | os.PathLike, size: int) -> Iterator[None]:
    """A full disk names the file and how many bytes the write needed."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            exc.filename = exc.filename or str(path)
            exc.bytes_needed = getattr(exc, "bytes_needed", None) or size
        raise


def disk_full(path: str | os.PathLike, size: int) -> OSError:
    """The error a full disk raises for `path`, with the bytes more the write needed."""
    exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    exc.bytes_needed = size
    return exc


def ensure_free_space(path: str | os.PathLike, size: int) -> None:
    """Refuse a write of `size` bytes into `path`'s folder before it starts when the disk has less
    free: writers that cannot fail cleanly half-way (HDF5) check first."""
    free = shutil.disk_usage(Path(path).parent).free
    if free < size:
        raise disk_full(path, size - free)
