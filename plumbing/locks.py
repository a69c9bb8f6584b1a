"""One writer per output: an `fcntl` lock file held while a command writes a run or an output set.

A second process that wants the same output fails at once with the holder's PID, instead of two
processes interleaving one metrics.jsonl or one set of files. The lock is a POSIX record lock
(`fcntl.lockf`): it belongs to the process, is not inherited by forked children (DataLoader
workers), and is released when the process ends, however it ends (SIGKILL included).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from plumbing.errors import RlcapError

_HELD: dict[Path, IO[str]] = {}  # locks this process holds, kept open for its lifetime


def hold_lock(path: str | Path, what: str) -> Path:
    """Take the lock file `path` for this process (re-entrant within it); RlcapError naming the
    holder's PID when another process has it."""
    path = Path(path).resolve()
    if path in _HELD:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open until the process ends
    try:
        fcntl.lockf(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RlcapError(f"{what} is in use by another process (PID {holder}, lock {path}); wait for it to "
                         "finish, or write to another place") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[path] = handle
    return path


def release_lock(path: str | Path) -> None:
    handle = _HELD.pop(Path(path).resolve(), None)
    if handle is not None:
        fcntl.lockf(handle.fileno(), fcntl.LOCK_UN)
        handle.close()
