"""Reading predictions (COCO results format) and references (Karpathy, COCO annotations, or
prepro's refs.json), with errors that name the file and the entry at fault."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from plumbing.errors import DataError
from plumbing.karpathy import load_dataset, read_json


def load_predictions(path: str | Path) -> dict[int, str]:
    """COCO results format: [{"image_id": int, "caption": str}, ...]."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of {{'image_id', 'caption'}} (COCO results format)")
    predictions: dict[int, str] = {}
    for k, entry in enumerate(data):
        if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
            raise DataError(f"{path}: entry {k} needs 'image_id' and 'caption'")
        image_id, caption = entry["image_id"], entry["caption"]
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise DataError(f"{path}: entry {k}: image_id must be an integer, got {image_id!r}")
        if not isinstance(caption, str):
            raise DataError(f"{path}: image id {image_id}: caption must be a string, got {type(caption).__name__}")
        if image_id in predictions:
            raise DataError(f"{path}: duplicate prediction for image id {image_id}")
        predictions[image_id] = caption
    if not predictions:
        raise DataError(f"{path}: no predictions")
    return predictions


def load_references(path: str | Path, split: str | None = None) -> dict[int, list[str]]:
    """Karpathy dataset.json (optionally one split), COCO captions_*.json, or prepro's refs.json."""
    data = read_json(path)
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        _note_no_splits(path, split)
        return _coco_annotations(path, data)
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        entries = load_dataset(path)
        if split is not None:
            entries = [e for e in entries if e.split == split]
            if not entries:
                raise DataError(f"{path}: no images in split {split!r}")
        return {e.image_id: e.raw_captions for e in entries}
    if isinstance(data, dict) and data and all(k.isdigit() and isinstance(v, list) for k, v in data.items()):
        _note_no_splits(path, split)
        return {int(k): _reference_list(path, int(k), v) for k, v in data.items()}
    raise DataError(f"{path}: not a Karpathy dataset.json, a COCO annotations file or a refs.json")


def _note_no_splits(path: str | Path, split: str | None) -> None:
    if split is not None:
        print(f"note: {path} has no splits (not a Karpathy dataset.json); split {split!r} is not applied",
              file=sys.stderr)


def _reference_list(path: str | Path, image_id: int, captions: list) -> list[str]:
    """A refs.json entry: a non-empty list of strings (never None, numbers or objects turned into text)."""
    if not captions:
        raise DataError(f"{path}: image id {image_id} has an empty reference list")
    bad = [c for c in captions if not isinstance(c, str)]
    if bad:
        raise DataError(f"{path}: image id {image_id}: every reference must be a string, got "
                        f"{type(bad[0]).__name__} {str(bad[0])[:60]!r}")
    return list(captions)


def _coco_annotations(path: str | Path, data: dict) -> dict[int, list[str]]:
    refs: dict[int, list[str]] = defaultdict(list)
    for k, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not isinstance(ann.get("image_id"), int) \
                or not isinstance(ann.get("caption"), str):
            raise DataError(f"{path}: annotations[{k}] needs an integer 'image_id' and a string 'caption'")
        refs[ann["image_id"]].append(ann["caption"])
    return dict(refs)
