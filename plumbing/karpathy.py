"""Reading Karpathy-format dataset.json files (COCO, Flickr8k/30k, the offline world).

Real files work unchanged: `restval` counts as train, `cocoid` and `filepath` are optional.
The image id is `cocoid` when present, else `imgid`. Every problem is a DataError that names
the file and the image at fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.errors import DataError

SPLIT_ALIASES = {"train": "train", "restval": "train", "val": "val", "test": "test"}


@dataclass
class ImageEntry:
    image_id: int
    split: str  # train | val | test (restval already mapped to train)
    filename: str
    filepath: str = ""
    raw_captions: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # e.g. the world's long captions

    @property
    def relpath(self) -> str:
        return str(Path(self.filepath) / self.filename) if self.filepath else self.filename


def read_json(path: str | Path) -> object:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (the file looks truncated)" if exc.pos >= len(text.rstrip()) - 1 else ""
        raise DataError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}") from None


def load_dataset(path: str | Path) -> list[ImageEntry]:
    """Parse and validate a Karpathy-format dataset.json."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"{path}: expected a JSON object with an 'images' list (Karpathy format)")
    entries: list[ImageEntry] = []
    seen: dict[int, int] = {}
    for index, raw in enumerate(data["images"]):
        entry = _parse_image(path, index, raw)
        if entry.image_id in seen:
            raise DataError(
                f"{path}: duplicate image id {entry.image_id} (entries {seen[entry.image_id]} and {index})"
            )
        seen[entry.image_id] = index
        entries.append(entry)
    if not entries:
        raise DataError(f"{path}: the 'images' list is empty")
    return entries


def _parse_image(path: str | Path, index: int, raw: object) -> ImageEntry:
    where = f"{path}: images[{index}]"
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected an object, got {type(raw).__name__}")
    if "split" not in raw and "file_name" in raw and "filename" not in raw:
        raise DataError(f"{path}: images[{index}] (id {raw.get('id')}) has no 'split': this looks like a COCO "
                        "annotations file (captions_*.json); prepro and training read a Karpathy-format file with "
                        "the splits, such as dataset_coco.json")
    image_id = raw.get("cocoid", raw.get("imgid"))
    if not isinstance(image_id, int) or isinstance(image_id, bool):
        raise DataError(f"{where}: needs an integer 'cocoid' or 'imgid', got {image_id!r}")
    where = f"{path}: image id {image_id}"
    split = SPLIT_ALIASES.get(raw.get("split"))
    if split is None:
        raise DataError(f"{where}: 'split' must be one of {sorted(SPLIT_ALIASES)}, got {raw.get('split')!r}")
    filename = raw.get("filename")
    if not isinstance(filename, str) or not filename:
        raise DataError(f"{where}: missing 'filename'")
    filepath = raw.get("filepath", "")
    if not isinstance(filepath, str):
        raise DataError(f"{where}: 'filepath' must be a string, got {filepath!r}")
    captions = _captions(where, raw.get("sentences"))
    extra = {k: v for k, v in raw.items() if k == "long_captions"}
    return ImageEntry(image_id, split, filename, filepath, captions, extra)


def _captions(where: str, sentences: object) -> list[str]:
    if not isinstance(sentences, list) or not sentences:
        raise DataError(f"{where}: has no sentences")
    captions = []
    for k, sent in enumerate(sentences):
        if isinstance(sent, dict) and isinstance(sent.get("raw"), str):
            captions.append(sent["raw"])
        elif isinstance(sent, dict) and isinstance(sent.get("tokens"), list) and all(
                isinstance(t, str) for t in sent["tokens"]):
            captions.append(" ".join(sent["tokens"]))
        else:
            raise DataError(f"{where}: sentences[{k}] needs a 'raw' string or a 'tokens' list of strings")
    return captions
