"""The world-foil check every reward-model recipe ends with: on val images of the offline world,
how often the trained model scores an image's correct caption above a caption with one fact
changed, per foil kind, for short and long captions (chance 0.5, a tie counts one half).

It scores with the model's own metric formula (clip_s / l_clip_s with the "A photo depicts "
prefix, specs without), from embeddings computed here, so a regression shows in every run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world.foils import world_foils
from features.world.scene import Scene, load_scenes
from plumbing.errors import DataError
from plumbing.tables import format_table
from rewards.clip import formulas
from rewards.recipes.contrastive import embed_texts
from rewards.recipes.data import Split, embed_split_images

FORMULAS = {"clip_s": (formulas.CLIP_S_PREFIX, formulas.clip_s), "specs": ("", formulas.specs)}


@dataclass(frozen=True)
class FoilJudgement:
    row: int  # the item's image, as a row of the split
    kind: str
    captions: str  # "short" or "long"
    win: float  # 1 when the true caption scores higher, 0.5 for a tie, else 0
    text_cosine: float  # between the true caption's and the foil's text embeddings


@torch.no_grad()
def foil_accuracy(encode_image: Callable, encode_text: Callable, tokenizer: ClipTokenizer, split: Split,
                  transform: Callable, scenes_path: str, formula: str, device: torch.device, workers: int = 0,
                  seed: int = 0) -> dict[str, dict[str, float]]:
    """{"short": {kind: accuracy, ..., "all": ...}, "long": {...}} on the split's images."""
    items = split_foils(split, load_scenes(scenes_path), seed, scenes_path)
    images = embed_split_images(encode_image, split, transform, device, workers)
    wins: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for judged in judge_foils(images, encode_text, tokenizer, items, formula, device):
        wins[judged.captions][judged.kind].append(judged.win)
        wins[judged.captions]["all"].append(judged.win)
    return {label: {kind: sum(v) / len(v) for kind, v in sorted(by_kind.items())} for label, by_kind in wins.items()}


def split_foils(split: Split, scenes: dict[int, Scene], seed: int = 0, scenes_path: str = "scenes.json") -> list[dict]:
    """The world's rendered foils of the split's images, one item per image (row order)."""
    missing = [image_id for image_id in split.image_ids if image_id not in scenes]
    if missing:
        raise DataError(f"{scenes_path}: no scene for image id {missing[0]} ({len(missing)} of {len(split.image_ids)} "
                        "images have none): is it the scenes file of this dataset?")
    return world_foils(scenes, dict(zip(split.image_ids, split.short, strict=True)), split.image_ids, seed)


@torch.no_grad()
def judge_foils(images: torch.Tensor, encode_text: Callable, tokenizer: ClipTokenizer, items: list[dict],
                formula: str, device: torch.device) -> list[FoilJudgement]:
    """Every foil of every item judged against its true caption, short and long, with the model's
    formula on the images' normalised embeddings [N, d] (row i = item i)."""
    prefix, score = FORMULAS[formula]
    judged = []
    for field, label in (("caption", "short"), ("long_caption", "long")):
        texts = [prefix + item[field] for item in items] + [prefix + f[field] for item in items for f in item["foils"]]
        embedded = embed_texts(encode_text, tokenizer, texts, device)
        right = score(images, embedded[: len(items)])
        k = len(items)
        for row, item in enumerate(items):
            for foil in item["foils"]:
                wrong = score(images[row: row + 1], embedded[k: k + 1])[0]
                win = 1.0 if right[row] > wrong else 0.5 if right[row] == wrong else 0.0
                judged.append(FoilJudgement(row, foil["kind"], label, win, float(embedded[row] @ embedded[k])))
                k += 1
    return judged


def foil_table(name: str, accuracy: dict[str, dict[str, float]]) -> str:
    kinds = sorted({k for by_kind in accuracy.values() for k in by_kind}, key=lambda k: (k == "all", k))
    rows = [[label, *(f"{by_kind.get(k, float('nan')):.3f}" for k in kinds)] for label, by_kind in accuracy.items()]
    return f"world-foil accuracy of {name} (val; chance 0.5):\n" + format_table(["captions", *kinds], rows)
