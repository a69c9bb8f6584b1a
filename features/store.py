"""HDF5 feature files: a resumable writer and a lazy, worker-safe reader.

A file is built under `<name>.partial`, one flushed batch at a time, and renamed to its final
name only when every image is in it. An interrupted run leaves the partial file; the next run
with the same backbone continues from it, a run with another backbone refuses it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np

from plumbing.atomic import disk_full, ensure_free_space, partial_path
from plumbing.errors import DataError
from plumbing.hdf5 import abandon, is_disk_full

IDENTITY_ATTRS = ("backbone", "fingerprint")
METADATA_ROOM = 1 << 20  # free bytes kept beyond an append's rows and chunks, for HDF5's own records


class FeatureWriter:
    """Append rows of named arrays keyed by image id; resume from a partial file."""

    def __init__(self, path: str | Path, columns: Mapping[str, tuple[tuple[int, ...], str]],
                 attrs: Mapping[str, object]):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.columns = dict(columns)
        self.attrs = dict(attrs)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.h5 = self._resume() if self.partial.exists() else None
        if self.h5 is None:
            ensure_free_space(self.partial, METADATA_ROOM)
            self.h5 = h5py.File(self.partial, "w")
            with self._disk_guard(METADATA_ROOM):
                self._create()

    def _resume(self) -> h5py.File | None:
        """The partial file of an interrupted run, checked before it is continued. One that does
        not read back (a crash mid-write) is moved aside and the work restarts; one from another
        model is an error."""
        try:
            h5 = h5py.File(self.partial, "a")
        except OSError as exc:
            return self._set_aside(f"it does not open ({exc})")
        try:
            rows = h5["image_ids"].shape[0]
            shapes = {name: h5[name].shape for name in self.columns}
            h5["image_ids"][:]
        except (KeyError, OSError, ValueError) as exc:
            h5.close()
            return self._set_aside(f"it is incomplete ({exc})")
        bad = [n for n, (tail, _) in self.columns.items() if shapes[n][1:] != tuple(tail) or shapes[n][0] < rows]
        if bad:
            h5.close()
            want = tuple(self.columns[bad[0]][0])
            return self._set_aside(f"its {bad[0]} column has shape {shapes[bad[0]]}, expected rows of {want}")
        try:
            check_identity(h5, self.attrs, self.partial)
        except DataError:
            h5.close()
            raise
        return h5

    def _set_aside(self, why: str) -> None:  # always None: the caller starts a new file
        aside = self.partial.with_name(self.partial.name + f".corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.partial, aside)
        print(f"{self.partial}: {why}; moved it to {aside} and starting this file again", file=sys.stderr)
        return None

    def _create(self) -> None:
        self.h5.create_dataset("image_ids", shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(1024,))
        for name, (tail, dtype) in self.columns.items():
            self.h5.create_dataset(name, shape=(0, *tail), maxshape=(None, *tail), dtype=dtype,
                                   chunks=(max(1, min(64, 2 ** 22 // max(1, int(np.prod(tail)) * 4))), *tail))
        for key, value in self.attrs.items():
            self.h5.attrs[key] = value

    @property
    def count(self) -> int:
        return int(self.h5["image_ids"].shape[0])

    def done_ids(self) -> set[int]:
        return set(self.h5["image_ids"][:].tolist())

    def truncate(self, count: int) -> None:
        """Drop rows past `count` (keeps two writers of one extraction in step after a crash)."""
        for name in ("image_ids", *self.columns):
            self.h5[name].resize(count, axis=0)

    def append(self, image_ids: Sequence[int], arrays: Mapping[str, np.ndarray]) -> None:
        start, stop = self.count, self.count + len(image_ids)
        need = self._bytes_needed(arrays, len(image_ids))
        ensure_free_space(self.partial, need)  # HDF5 must never meet a full disk (plumbing.hdf5)
        with self._disk_guard(need):
            # Columns first, ids last: a crash mid-append leaves ids that only count complete rows.
            for name in self.columns:
                self.h5[name].resize(stop, axis=0)
                self.h5[name][start:stop] = arrays[name]
            self.h5["image_ids"].resize(stop, axis=0)
            self.h5["image_ids"][start:stop] = np.asarray(image_ids, dtype=np.int64)
            self.h5.flush()

    def _bytes_needed(self, arrays: Mapping[str, np.ndarray], rows: int) -> int:
        """The rows' bytes, plus a whole chunk per column (HDF5 allocates chunks whole) and room for records."""
        chunks = sum(int(np.prod(self.h5[name].chunks)) * self.h5[name].dtype.itemsize for name in self.columns)
        return sum(int(np.asarray(a).nbytes) for a in arrays.values()) + 8 * rows + chunks + METADATA_ROOM

    @contextlib.contextmanager
    def _disk_guard(self, size: int) -> Iterator[None]:
        """HDF5 meeting a full disk anyway: the broken partial file is removed and the error is the usual one."""
        try:
            yield
        except (OSError, RuntimeError) as exc:
            if not is_disk_full(exc):
                raise
            abandon(self.h5, self.partial)
            raise disk_full(self.partial, size) from None

    def finish(self) -> Path:
        with self._disk_guard(METADATA_ROOM):
            self.h5.flush()
            self.h5.close()
        os.replace(self.partial, self.path)
        return self.path

    def close(self) -> None:
        if self.h5.id.valid:
            with self._disk_guard(METADATA_ROOM):
                self.h5.close()


def check_identity(h5: h5py.File, attrs: Mapping[str, object], where: Path) -> None:
    for key in IDENTITY_ATTRS:
        have, want = h5.attrs.get(key), attrs.get(key)
        if want is not None and have != want:
            raise DataError(
                f"{where}: holds features from another model ({key} {have!r}, this run {want!r}); "
                f"delete it or write to another --out"
            )


class FeatureReader:
    """Rows of a features file by image id, read lazily.

    The HDF5 handle is opened on first use in each process (h5py handles must not cross a
    fork), so the reader can live inside a DataLoader dataset with workers.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: features file not found")
        try:
            with h5py.File(self.path, "r") as h5:
                ids = h5["image_ids"][:]
                self.attrs = dict(h5.attrs)
                self.names = [k for k in h5 if k != "image_ids"]
                self.shapes = {k: h5[k].shape for k in self.names}
                self.dtypes = {k: str(h5[k].dtype) for k in self.names}
        except (OSError, KeyError) as exc:
            raise DataError(f"{self.path}: not a readable features file: {exc}") from None
        self.row_of = {int(i): r for r, i in enumerate(ids)}
        self._h5: h5py.File | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.row_of)

    def _file(self) -> h5py.File:
        if self._h5 is None or self._pid != os.getpid():
            self._h5 = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._h5

    def missing(self, image_ids: Sequence[int]) -> list[int]:
        return [i for i in image_ids if int(i) not in self.row_of]

    def require(self, image_ids: Sequence[int], what: str = "the dataset") -> None:
        missing = self.missing(image_ids)
        if missing:
            raise DataError(f"{self.path}: no features for {len(missing)} image(s) of {what}, e.g. ids {missing[:5]}")

    def check_backbone(self, backbone: str) -> None:
        if self.attrs.get("backbone") != backbone:
            raise DataError(f"{self.path}: features from backbone {self.attrs.get('backbone')!r}, "
                            f"expected {backbone!r}")

    def get(self, name: str, image_id: int) -> np.ndarray:
        try:
            row = self.row_of[int(image_id)]
        except KeyError:
            raise DataError(f"{self.path}: no features for image id {image_id}") from None
        return self._file()[name][row]

    def get_many(self, name: str, image_ids: Sequence[int]) -> np.ndarray:
        rows = [self.row_of[int(i)] for i in image_ids]
        order = np.argsort(rows)
        data = self._file()[name][np.asarray(rows)[order]] if len(set(rows)) == len(rows) else None
        if data is None:
            return np.stack([self.get(name, i) for i in image_ids])
        out = np.empty_like(data)
        out[order] = data
        return out
