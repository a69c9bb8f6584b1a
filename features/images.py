"""Image paths resolved safely inside an images root, images decoded to RGB correctly whatever
their mode, and a Dataset that reads them."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from plumbing.errors import DataError
from plumbing.karpathy import ImageEntry

# Decoding failures that belong to one image file (the file is named in the message).
IMAGE_ERRORS = (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError,
                Image.DecompressionBombWarning, SyntaxError)


def resolve_image_path(root: str | Path, entry: ImageEntry, allow_outside_root: bool = False) -> str:
    """root/filepath/filename, refusing a path that leaves the root: absolute, `..`, or a symlink
    whose target lies outside (unless `allow_outside_root`, e.g. a root of links into a shared store)."""
    root_norm = os.path.normpath(os.path.abspath(root))
    path = os.path.normpath(os.path.join(root_norm, entry.relpath))
    if allow_outside_root:
        return path
    real_root, real_path = os.path.realpath(root_norm), os.path.realpath(path)
    if os.path.commonpath([root_norm, path]) != root_norm or os.path.commonpath([real_root, real_path]) != real_root:
        raise DataError(f"image id {entry.image_id}: path {entry.relpath!r} resolves to {real_path}, outside the "
                        f"images root {root} (--allow-outside-root permits this)")
    return path


def check_images_exist(root: str | Path, entries: list[ImageEntry], allow_outside_root: bool = False) -> list[str]:
    if not Path(root).is_dir():
        raise DataError(f"images root {root} is not a directory")
    paths = [resolve_image_path(root, e, allow_outside_root) for e in entries]
    missing = [(e.image_id, p) for e, p in zip(entries, paths, strict=True) if not os.path.isfile(p)]
    if missing:
        shown = "; ".join(f"id {i}: {p}" for i, p in missing[:5])
        raise DataError(f"{len(missing)} image(s) missing under {root}: {shown}")
    return paths


def open_rgb(path: str | Path) -> Image.Image:
    """An 8-bit RGB image. High-bit-depth grayscale (16-bit PNGs) is scaled, not clipped to white;
    palette and alpha images convert through RGBA; an image too large to decode safely is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(path) as img:
            img.load()
            return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        if img.mode == "F" and values.max(initial=0) <= 1.0:
            top = 1.0
        gray = np.clip(np.rint(values / top * 255.0), 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


class ImageFiles(Dataset):
    """Yields (row, tensor, error). Decoding errors come back as data, so that the main process
    can raise one clear DataError naming the image instead of a wrapped worker traceback. Without
    `ids` (files that are not a dataset's images) the error names the file alone."""

    def __init__(self, paths: list[str], ids: list[int] | None, rows: list[int], transform: Callable):
        self.paths, self.ids, self.rows, self.transform = paths, ids, rows, transform

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k: int) -> tuple[int, torch.Tensor | None, str]:
        row = self.rows[k]
        try:
            return row, self.transform(open_rgb(self.paths[row])), ""
        except IMAGE_ERRORS as exc:
            named = f"image id {self.ids[row]}: " if self.ids is not None else ""
            return row, None, f"{named}cannot read {self.paths[row]}: {exc}"


def collate(batch: list[tuple[int, torch.Tensor | None, str]]) -> tuple[list[int], torch.Tensor | None, list[str]]:
    rows = [b[0] for b in batch]
    errors = [b[2] for b in batch if b[2]]
    if errors:
        return rows, None, errors
    return rows, torch.stack([b[1] for b in batch]), []


def image_files(sources: list[str]) -> list[Path]:
    """Files named directly, or the files of named folders (not recursive), sorted by name."""
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"{source}: no such image file or folder")
    if not files:
        raise DataError(f"no image files in {', '.join(sources)}")
    return files


def file_numbers(files: list[Path]) -> dict[Path, int]:
    """The COCO-style id in each file name that has one: its last number
    (COCO_val2014_000000000042.jpg -> 42, world_000012.png -> 12)."""
    numbers = {f: re.findall(r"\d+", f.stem) for f in files}
    return {f: int(found[-1]) for f, found in numbers.items() if found}


def file_image_ids(files: list[Path]) -> tuple[list[int], bool]:
    """Each file's id from its name (`file_numbers`), or, when some name carries no number or two
    carry the same one, every file's position in the list; and whether the names gave them."""
    numbers = file_numbers(files)
    if len(numbers) == len(files) and len(set(numbers.values())) == len(files):
        return [numbers[f] for f in files], True
    return list(range(len(files))), False
