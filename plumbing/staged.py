"""Output sets replaced whole: a command that writes a folder of files that belong together (prepro's
labels, vocabulary, references and manifest; the world's images, dataset and scenes) builds the new set
beside the old one, at `<out>.partial`, and swaps it in only when it is complete.

A failed or killed rebuild leaves the old folder exactly as it was. The swap is one atomic exchange of
the two folders where Linux offers it (renameat2 with RENAME_EXCHANGE), else two renames with the old
folder parked at `<out>.previous` for the instant between them; `recover` puts a parked folder back.
Files in the old folder that are not part of the set (a lock, a user's notes) are carried over.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging_path(final: str | os.PathLike) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".partial")


def previous_path(final: str | os.PathLike) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".previous")


def recover(final: str | os.PathLike) -> None:
    """Finish what a swap killed between its two renames left: the old folder back in place when the
    new one never arrived, and the parked one removed when it did."""
    final, parked = Path(final), previous_path(final)
    if not parked.is_dir():
        return
    if final.exists():
        shutil.rmtree(parked, ignore_errors=True)
    else:
        os.replace(parked, final)


@contextlib.contextmanager
def staged_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder beside `final`; swap it in for `final` when the block succeeds, and
    remove it when the block fails (the old `final` untouched either way)."""
    final = Path(final)
    recover(final)
    staging = staging_path(final)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, final)


def swap_in(staging: Path, final: Path) -> None:
    """Make `staging` the folder at `final`; the old one's other files come along."""
    if not final.exists():
        os.replace(staging, final)
        return
    moved_later = _carry_files(final, staging)
    if _exchange(staging, final):
        old = staging
    else:
        old = previous_path(final)
        os.replace(final, old)
        os.replace(staging, final)
    for name in moved_later:
        if (old / name).exists() and not (final / name).exists():
            os.replace(old / name, final / name)
    shutil.rmtree(old, ignore_errors=True)


def _carry_files(old: Path, new: Path) -> list[str]:
    """Hard-link the old folder's regular files that the new set lacks into it (they stay in both
    until the swap); name the folders and links among them, which move after the swap."""
    later = []
    for entry in os.scandir(old):
        target = new / entry.name
        if target.exists() or target.is_symlink() or entry.name.endswith(".partial"):
            continue  # the new set's own file, or a temporary one of an interrupted write
        if entry.is_file(follow_symlinks=False):
            try:
                os.link(entry.path, target)
            except OSError:
                shutil.copy2(entry.path, target)
        else:
            later.append(entry.name)
    return later


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two folders (Linux renameat2); False where the system cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0
