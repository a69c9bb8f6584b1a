"""Image paths resolved safely inside an images root, and a Dataset that reads them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from plumbing.errors import DataError
from plumbing.karpathy import ImageEntry


def resolve_image_path(root: str | Path, entry: ImageEntry) -> str:
    """root/filepath/filename, refusing paths that leave the root (absolute or `..`).

    Symlinks inside the root are allowed (COCO folders are often links); only the written path
    is checked.
    """
    root_norm = os.path.normpath(os.path.abspath(root))
    path = os.path.normpath(os.path.join(root_norm, entry.relpath))
    if os.path.commonpath([root_norm, path]) != root_norm:
        raise DataError(f"image id {entry.image_id}: path {entry.relpath!r} escapes the images root {root}")
    return path


def check_images_exist(root: str | Path, entries: list[ImageEntry]) -> list[str]:
    if not Path(root).is_dir():
        raise DataError(f"images root {root} is not a directory")
    paths = [resolve_image_path(root, e) for e in entries]
    missing = [(e.image_id, p) for e, p in zip(entries, paths, strict=True) if not os.path.isfile(p)]
    if missing:
        shown = "; ".join(f"id {i}: {p}" for i, p in missing[:5])
        raise DataError(f"{len(missing)} image(s) missing under {root}: {shown}")
    return paths


class ImageFiles(Dataset):
    """Yields (row, tensor, error). Decoding errors come back as data, so that the main process
    can raise one clear DataError naming the image instead of a wrapped worker traceback."""

    def __init__(self, paths: list[str], ids: list[int], rows: list[int], transform: Callable):
        self.paths, self.ids, self.rows, self.transform = paths, ids, rows, transform

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[int, torch.Tensor | None, str]:
        row = self.rows[k]
        try:
            with Image.open(self.paths[row]) as img:
                return row, self.transform(img.convert("RGB")), ""
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            return row, None, f"image id {self.ids[row]}: cannot read {self.paths[row]}: {exc}"


def collate(batch: list[tuple[int, torch.Tensor | None, str]]) -> tuple[list[int], torch.Tensor | None, list[str]]:
    rows = [b[0] for b in batch]
    errors = [b[2] for b in batch if b[2]]
    if errors:
        return rows, None, errors
    return rows, torch.stack([b[1] for b in batch]), []
