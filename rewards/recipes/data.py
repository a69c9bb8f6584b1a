"""Image-text data for training reward models, streamed from image files.

A split is a list of image paths and each image's caption pool (short references, long captions,
detail units); only the texts are held in memory. `TextsDataset` decodes one image per item in
a DataLoader worker and asks a recipe's `texts(row, rng)` for that image's texts (a caption, its
hard negatives, specificity triplets...). The rng is seeded by (seed, epoch, row), so what an
image gets in an epoch does not depend on workers, processes or resuming. `collate` tokenises the
texts into one [B, T, L] tensor trimmed to the batch's longest sequence, so accelerate can split
a global batch across processes along the image axis.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from features.clip_models.tokens import ClipTokenizer
from features.images import IMAGE_ERRORS, check_images_exist, open_rgb
from plumbing.errors import DataError
from plumbing.karpathy import ImageEntry, load_dataset
from rewards.recipes.mirror import MirrorMode, mirror_image, mirror_text, random_axes, twin_axes

CaptionKind = Literal["short", "long", "both"]


@dataclass
class Split:
    """One split's images (paths, ids, dataset entries) and caption pools, row for row."""

    image_ids: list[int]
    paths: list[str]
    short: list[list[str]]  # reference captions per image
    long: list[list[str]]  # long detailed captions per image (may be empty lists)
    entries: list[ImageEntry]  # the dataset entries (detail units, extra fields)
    pixels: PixelCache | None = None  # every image preprocessed once (`cache_pixels`), else None

    def __len__(self) -> int:
        return len(self.image_ids)

    def subset(self, rows: list[int]) -> Split:
        return Split(*([getattr(self, f)[k] for k in rows] for f in ("image_ids", "paths", "short", "long", "entries")))

    def pool(self, kind: CaptionKind) -> list[list[str]]:
        if kind == "short":
            return self.short
        if kind == "long":
            return self.long
        return [s + lo for s, lo in zip(self.short, self.long, strict=True)]


class PixelCache(NamedTuple):
    """A split's images as `transform` makes them, row by row in one tensor."""

    transform: Callable
    images: torch.Tensor


def read_error(split: Split, row: int, exc: Exception) -> str:
    """The line that names an image a dataset item could not read, with its id and file."""
    return f"image id {split.image_ids[row]}: cannot read {split.paths[row]}: {exc}"


def split_pixels(split: Split, row: int, transform: Callable) -> torch.Tensor:
    """The row's image as `transform` makes it: from the split's pixel cache when that holds this
    transform's output, else decoded from its file (which may raise one of IMAGE_ERRORS)."""
    cache = split.pixels
    if cache is not None and cache.transform is transform:
        return cache.images[row]
    return transform(open_rgb(split.paths[row]))


def cache_pixels(split: Split, transform: Callable, limit_mb: int, workers: int) -> bool:
    """Decode and preprocess every image of `split` once and keep them in memory, when they fit in
    `limit_mb`: multi-epoch recipes then stop decoding the same files every epoch (on the world,
    about 1.5 s of CPU per 4,000 images, taken from the two cores that train). Reads give the same
    tensors as decoding does. A split with an image that cannot be read stays uncached, and the
    error is raised where the image is read, naming the file."""
    if limit_mb <= 0 or not len(split):
        return False
    try:
        first = transform(open_rgb(split.paths[0]))
    except IMAGE_ERRORS:
        return False
    if len(split) * first.numel() * first.element_size() > limit_mb * 2**20:
        return False
    images = torch.empty(len(split), *first.shape, dtype=first.dtype)
    at = 0
    for batch in image_batches(split, transform, workers):
        if batch["errors"]:
            return False
        images[at:at + len(batch["images"])] = batch["images"]
        at += len(batch["images"])
    split.pixels = PixelCache(transform, images)
    return True


def image_batches(split: Split, transform: Callable, workers: int, batch_size: int = 256) -> DataLoader:
    """The split's images in order, as {"images", "errors"} batches (one pass, for precomputing).
    Its own generator: drawing the workers' seed from the global one would change the run's random
    stream, and so what a run trains."""
    rows = ImagesWithTargets(split, transform, torch.zeros(len(split)))
    return DataLoader(rows, batch_size=batch_size, num_workers=workers, collate_fn=collate_targets,
                      generator=torch.Generator())


def long_captions(entry: ImageEntry) -> list[str]:
    return [c["raw"] for c in entry.extra.get("long_captions", []) if isinstance(c, dict) and c.get("raw")]


def load_split(dataset: str, images_root: str, split: str, limit: int = 0, need_long: bool = False,
               allow_outside_root: bool = False) -> Split:
    entries = [e for e in load_dataset(dataset) if e.split == split]
    if limit:
        entries = entries[:limit]
    if not entries:
        raise DataError(f"{dataset}: no images in split {split!r}")
    if need_long and not any(long_captions(e) for e in entries):
        raise DataError(f"{dataset}: split {split!r} has no long captions ('long_captions' per image)")
    paths = check_images_exist(images_root, entries, allow_outside_root)
    return Split([e.image_id for e in entries], paths, [e.raw_captions for e in entries],
                 [long_captions(e) for e in entries], entries)


TextsFor = Callable[[int, random.Random], list[str]]


ImageNegativeFor = Callable[[int, random.Random, str], "Image.Image | None"]


class View(NamedTuple):
    """One view of an image: its row, pixels, texts, a decoding error (else "") and, with image
    negatives, a picture that its first text is false of (None when there is none)."""

    row: int
    image: torch.Tensor | None
    texts: list[str]
    error: str
    negative: torch.Tensor | None = None


class TextsDataset(Dataset):
    """Items: the views of one image, each (row, image tensor, texts of that view): the image
    itself, flipped at random (`mirror: random`) or with its mirrored twin (`mirror: pairs`; see
    rewards.recipes.mirror). Image decoding errors come back as data, so the main process raises
    one DataError naming the file instead of a worker traceback."""

    def __init__(self, split: Split, transform: Callable, texts: TextsFor, seed: int, mirror: MirrorMode = "none",
                 mirror_axes: tuple[str, ...] = ("horizontal",), image_negative: ImageNegativeFor | None = None):
        self.split, self.transform, self.texts, self.seed = split, transform, texts, seed
        self.mirror, self.mirror_axes = mirror, tuple(mirror_axes)
        self.image_negative = image_negative
        self._epoch = torch.zeros(1, dtype=torch.long).share_memory_()  # seen by persistent workers too

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = epoch

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, row: int) -> list[View]:
        rng = random.Random(f"{self.seed}-{self.epoch}-{row}")
        try:  # flips need the decoded picture; unflipped views take the split's cached pixels if any
            image = open_rgb(self.split.paths[row]) if self.mirror != "none" else \
                split_pixels(self.split, row, self.transform)
        except IMAGE_ERRORS as exc:
            return [View(row, None, [], read_error(self.split, row, exc))]
        texts = self.texts(row, rng)
        negative = self.image_negative(row, rng, texts[0]) if self.image_negative and texts else None
        if self.mirror == "none":
            return [View(row, image, texts, "", None if negative is None else self.transform(negative))]
        if self.mirror == "random":
            return [self._view(row, image, texts, negative, random_axes(self.mirror_axes, rng))]
        axes = twin_axes(texts, self.mirror_axes, rng)
        return [self._view(row, image, texts, negative, ()), self._view(row, image, texts, negative, axes)]

    def _view(self, row: int, image: Image.Image, texts: list[str], negative: Image.Image | None,
              axes: tuple[str, ...]) -> View:
        """The view flipped along `axes` (none: as it is), its texts rewritten to match."""
        if axes:
            image, texts = mirror_image(image, axes), [mirror_text(t, axes) for t in texts]
            negative = mirror_image(negative, axes) if negative is not None else None
        return View(row, self.transform(image), texts, "", None if negative is None else self.transform(negative))


class TextBatcher:
    """Collates views into {"rows", "images" [B,3,H,W], "tokens" [B,T,L], "mask" [B,T], "caption_ids" [B],
    "errors"}, where views with the same caption share a caption id (`text_id`):
    T is the most texts any image has, L the longest tokenised text (padding is exact under a
    causal mask). Unreadable images come back in "errors" for the main process to report."""

    def __init__(self, tokenizer: ClipTokenizer):
        self.tokenizer = tokenizer

    def __call__(self, images: list[list[View]]) -> dict:
        items = [view for views in images for view in views]
        errors = [view.error for view in items if view.error]
        if errors:
            return {"errors": errors}
        per_image = max(len(view.texts) for view in items)
        flat = [t for view in items for t in view.texts]
        ids = self.tokenizer.ids(flat)
        length = max(len(t) for t in ids)
        tokens = torch.zeros(len(items), per_image, length, dtype=torch.long)
        mask = torch.zeros(len(items), per_image, dtype=torch.bool)
        k = 0
        for b, view in enumerate(items):
            for t in range(len(view.texts)):
                tokens[b, t, : len(ids[k])] = torch.tensor(ids[k], dtype=torch.long)
                mask[b, t] = True
                k += 1
        caption_ids = [text_id(view.texts[0] if view.texts else "") for view in items]
        batch = {"rows": torch.tensor([view.row for view in items]), "images": torch.stack([v.image for v in items]),
                 "tokens": tokens, "mask": mask, "caption_ids": torch.tensor(caption_ids), "errors": []}
        if any(view.negative is not None for view in items):
            batch["negative_images"] = torch.stack([v.image if v.negative is None else v.negative for v in items])
            batch["negative_mask"] = torch.tensor([view.negative is not None for view in items])
        return batch


def text_id(text: str) -> int:
    """A 63-bit id of a text's content: the same on every process, which each collate their own
    share of a global batch."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def raise_errors(batch: dict) -> None:
    errors = batch.get("errors") or []
    if errors:
        raise DataError(errors[0] + (f" (and {len(errors) - 1} more in this batch)" if len(errors) > 1 else ""))


def pick(pool: list[str], rng: random.Random) -> str:
    return pool[rng.randrange(len(pool))]


class ImagesWithTargets(Dataset):
    """(image tensor, target) per row of a split, for supervised stages of the recipes (scene labels,
    a teacher's feature maps); an image that cannot be read comes back as an error string."""

    def __init__(self, split: Split, transform: Callable, targets: list[torch.Tensor] | torch.Tensor):
        if len(targets) != len(split):
            raise ValueError(f"{len(targets)} targets for {len(split)} images")
        self.split, self.transform, self.targets = split, transform, targets

    def __len__(self) -> int:
        return len(self.split)

    def set_epoch(self, epoch: int) -> None:  # the loop's hook; nothing here depends on the epoch
        pass

    def __getitem__(self, row: int) -> tuple[torch.Tensor | None, torch.Tensor, str]:
        try:
            return split_pixels(self.split, row, self.transform), self.targets[row], ""
        except IMAGE_ERRORS as exc:
            return None, self.targets[row], read_error(self.split, row, exc)


def collate_targets(items: list[tuple]) -> dict:
    """Images stacked, and targets stacked (a tuple of targets per item: each position stacked)."""
    errors = [error for *_, error in items if error]
    if errors:
        return {"errors": errors}
    targets = [target for _, target, _ in items]
    stacked = (tuple(torch.stack(column) for column in zip(*targets, strict=True)) if isinstance(targets[0], tuple)
               else torch.stack(targets))
    return {"images": torch.stack([image for image, _, _ in items]), "targets": stacked, "errors": []}


@torch.no_grad()
def embed_split_images(encode: Callable[[torch.Tensor], torch.Tensor], split: Split, transform: Callable,
                       device: torch.device, workers: int, batch_size: int = 256) -> torch.Tensor:
    """L2-normalised embeddings [N, d] of a split's images, streamed: never all pixels at once."""
    loader = DataLoader(TextsDataset(split, transform, _no_texts, 0), batch_size=batch_size, num_workers=workers,
                        collate_fn=_images_only)
    chunks = []
    for images, errors in loader:
        if errors:
            raise DataError(errors[0])
        chunks.append(torch.nn.functional.normalize(encode(images.to(device)).float(), dim=-1))
    return torch.cat(chunks)


def _no_texts(row: int, rng: random.Random) -> list[str]:
    return []


def _images_only(images: list[list[View]]) -> tuple[torch.Tensor | None, list[str]]:
    items = [view for views in images for view in views]
    errors = [view.error for view in items if view.error]
    return (None, errors) if errors else (torch.stack([view.image for view in items]), [])
