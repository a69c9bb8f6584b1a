"""Image–caption data for training reward models: a split's images decoded once into a tensor
with the model's eval transform, and each image's caption pool (short references, long captions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from features.images import ImageFiles, check_images_exist, collate
from plumbing.errors import DataError
from plumbing.karpathy import ImageEntry, load_dataset

CaptionKind = Literal["short", "long", "both"]


@dataclass
class ImageCaptions:
    image_ids: list[int]
    images: torch.Tensor  # [N, 3, H, W], transformed
    short: list[list[str]]  # reference captions per image
    long: list[list[str]]  # long detailed captions per image (may be empty lists)
    entries: list[ImageEntry]  # the dataset entries, row for row (detail units, ids)

    def pool(self, kind: CaptionKind) -> list[list[str]]:
        if kind == "short":
            return self.short
        if kind == "long":
            return self.long
        return [s + lo for s, lo in zip(self.short, self.long, strict=True)]


def long_captions(entry: ImageEntry) -> list[str]:
    return [c["raw"] for c in entry.extra.get("long_captions", []) if isinstance(c, dict) and c.get("raw")]


def load_split(dataset: str, images_root: str, split: str, transform, limit: int = 0, workers: int = 2,
               need_long: bool = False, progress: bool = True) -> ImageCaptions:
    entries = [e for e in load_dataset(dataset) if e.split == split]
    if limit:
        entries = entries[:limit]
    if not entries:
        raise DataError(f"{dataset}: no images in split {split!r}")
    if need_long and not any(long_captions(e) for e in entries):
        raise DataError(f"{dataset}: split {split!r} has no long captions ('long_captions' per image)")
    paths = check_images_exist(images_root, entries)
    ids = [e.image_id for e in entries]
    loader = DataLoader(ImageFiles(paths, ids, list(range(len(ids))), transform), batch_size=256,
                        num_workers=workers, collate_fn=collate)
    chunks = []
    for _, images, errors in tqdm(loader, desc=f"load {split} images", unit="batch", disable=not progress):
        if errors:
            raise DataError(errors[0])
        chunks.append(images)
    return ImageCaptions(ids, torch.cat(chunks), [e.raw_captions for e in entries],
                         [long_captions(e) for e in entries], entries)


def sample_captions(pools: list[list[str]], rows: list[int], generator: torch.Generator) -> list[str]:
    """One caption per row, drawn uniformly from its pool."""
    picks = []
    for row in rows:
        pool = pools[row]
        picks.append(pool[int(torch.randint(len(pool), (1,), generator=generator))])
    return picks
