"""HDF5 writes that end in one clear error on a full disk, never in a crash.

When HDF5 itself meets a full disk it leaves its file half-flushed: closing it fails inside h5py's
deallocator (an error Python can only ignore), the rename after it then publishes a broken file,
and the library's own clean-up at exit can crash the interpreter. So no HDF5 call here is allowed to
meet one: a file that fits in memory is built in memory and written with plain writes, and a
streamed file checks the free space before each append (`features.store.FeatureWriter`). Should
HDF5 still meet a full disk (another process filled it in between), `abandon` frees the file's
space first, so that its close succeeds, and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from collections.abc import Callable
from pathlib import Path

import h5py

from plumbing.atomic import write_bytes


def write_h5(path: str | os.PathLike, fill: Callable[[h5py.File], None]) -> None:
    """Write the HDF5 file that `fill` builds, atomically; the disk sees only plain writes."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        fill(h5)
    write_bytes(path, buffer.getvalue())


def is_disk_full(exc: BaseException) -> bool:
    """True for a full disk, whether Python or HDF5 reports it (HDF5 puts errno 28 in its message)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    text = str(exc)
    return isinstance(exc, (OSError, RuntimeError)) and ("errno = 28" in text or "No space left on device" in text)


def abandon(h5: h5py.File, path: str | os.PathLike) -> None:
    """Close a file HDF5 failed to write and remove it: emptied first, so that the close has room."""
    with contextlib.suppress(OSError):
        os.truncate(path, 0)
    with contextlib.suppress(Exception):
        h5.close()
    Path(path).unlink(missing_ok=True)
