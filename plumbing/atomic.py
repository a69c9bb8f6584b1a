"""Write files so that a final name never holds a half-written file.

Everything goes to a temporary name in the same directory and is renamed into place only
after it was completely written (rename within a directory is atomic on POSIX).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
    try:
        yield tmp
    except BaseException:
        if not keep_partial:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    os.replace(tmp, final)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> None:
    write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line and flush it to disk (logs such as metrics.jsonl)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line.rstrip("\n") + "\n")
        fh.flush()
        os.fsync(fh.fileno())
