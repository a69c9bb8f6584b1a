"""Caption batches: images with their features and `seq_per_img` captions.

Features are read lazily from feats.h5 (a FeatureReader per worker process); labels are small
and held in memory. Which captions an image contributes in an epoch is a pure function of
(seed, epoch, image), so runs are repeatable and resumable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from features.store import FeatureReader
from plumbing.errors import DataError


@dataclass
class Labels:
    image_ids: np.ndarray
    split: np.ndarray  # str per image
    labels: np.ndarray  # [M, L]
    start: np.ndarray  # 0-based first caption row per image
    end: np.ndarray  # 0-based exclusive end

    @classmethod
    def load(cls, path: str | Path) -> Labels:
        try:
            with h5py.File(path, "r") as h5:
                base = int(h5.attrs.get("label_ix_base", 1))
                return cls(h5["image_ids"][:], np.asarray([s.decode() for s in h5["split"][:]]),
                           h5["labels"][:], h5["label_start_ix"][:] - base, h5["label_end_ix"][:] - base + 1)
        except FileNotFoundError:
            raise DataError(f"{path}: labels file not found (run captioner.prepro)") from None
        except (OSError, KeyError) as exc:
            raise DataError(f"{path}: not a prepro labels.h5: {exc}") from None

    @property
    def max_len(self) -> int:
        return int(self.labels.shape[1])

    def rows(self, split: str) -> np.ndarray:
        rows = np.flatnonzero(self.split == split)
        if len(rows) == 0:
            raise DataError(f"no images in split {split!r}")
        return rows


class CaptionDataset(Dataset):
    """Items are images of one split: features plus `seq_per_img` caption rows."""

    def __init__(self, labels: Labels, feats_path: str | Path, split: str, seq_per_img: int, seed: int = 0):
        self.labels, self.split, self.seq_per_img, self.seed = labels, split, seq_per_img, seed
        self.rows = labels.rows(split)
        self.feats = FeatureReader(feats_path)
        self.feats.require(labels.image_ids[self.rows].tolist(), what=f"split {split!r} of the labels")
        self.has_mask = "att_mask" in self.feats.names
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.rows)

    def captions(self, index: int) -> np.ndarray:
        row = self.rows[index]
        start, end = self.labels.start[row], self.labels.end[row]
        n = end - start
        rng = np.random.default_rng([self.seed, self.epoch, int(row)])
        # Fewer captions than seq_per_img: sample with replacement, as the reference codebase does.
        pick = rng.choice(n, self.seq_per_img, replace=n < self.seq_per_img)
        return self.labels.labels[start + pick]

    def __getitem__(self, index: int) -> dict:
        image_id = int(self.labels.image_ids[self.rows[index]])
        att = self.feats.get("att", image_id).astype(np.float32)
        item = {"image_id": image_id, "att": torch.from_numpy(att),
                "fc": torch.from_numpy(self.feats.get("fc", image_id).astype(np.float32)),
                "labels": torch.from_numpy(self.captions(index).astype(np.int64))}
        mask = self.feats.get("att_mask", image_id) if self.has_mask else np.ones(len(att), dtype=bool)
        item["att_mask"] = torch.from_numpy(np.asarray(mask, dtype=bool))
        return item


def collate(items: list[dict]) -> dict:
    return {
        "image_ids": torch.tensor([it["image_id"] for it in items], dtype=torch.long),
        "att": torch.stack([it["att"] for it in items]),
        "fc": torch.stack([it["fc"] for it in items]),
        "att_mask": torch.stack([it["att_mask"] for it in items]),
        "labels": torch.stack([it["labels"] for it in items]),
    }
