"""The world-foil check every reward-model recipe ends with: on val images of the offline world,
how often the trained model scores an image's correct caption above a caption with one fact
changed, per foil kind, for short and long captions (chance 0.5, a tie counts one half).

It scores with the model's own metric formula (clip_s / l_clip_s with the "A photo depicts "
prefix, specs without), from embeddings computed here, so a regression shows in every run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

from features.clip_models.tokens import ClipTokenizer
from features.world.foils import world_foils
from features.world.scene import load_scenes
from plumbing.tables import format_table
from rewards.clip import formulas
from rewards.recipes.contrastive import embed_texts
from rewards.recipes.data import Split, embed_split_images

FORMULAS = {"clip_s": (formulas.CLIP_S_PREFIX, formulas.clip_s), "specs": ("", formulas.specs)}


@torch.no_grad()
def foil_accuracy(encode_image: Callable, encode_text: Callable, tokenizer: ClipTokenizer, split: Split,
                  transform: Callable, scenes_path: str, formula: str, device: torch.device, workers: int = 0,
                  seed: int = 0) -> dict[str, dict[str, float]]:
    """{"short": {kind: accuracy, ..., "all": ...}, "long": {...}} on the split's images."""
    prefix, score = FORMULAS[formula]
    scenes = load_scenes(scenes_path)
    items = world_foils(scenes, dict(zip(split.image_ids, split.short, strict=True)), split.image_ids, seed)
    images = embed_split_images(encode_image, split, transform, device, workers)
    out = {}
    for field, label in (("caption", "short"), ("long_caption", "long")):
        texts = [prefix + item[field] for item in items] + [prefix + f[field] for item in items for f in item["foils"]]
        embedded = embed_texts(encode_text, tokenizer, texts, device)
        right = score(images, embedded[: len(items)])
        wins: dict[str, list[float]] = defaultdict(list)
        k = len(items)
        for row, item in enumerate(items):
            for foil in item["foils"]:
                wrong = score(images[row: row + 1], embedded[k: k + 1])[0]
                win = 1.0 if right[row] > wrong else 0.5 if right[row] == wrong else 0.0
                wins[foil["kind"]].append(win)
                wins["all"].append(win)
                k += 1
        out[label] = {kind: sum(v) / len(v) for kind, v in sorted(wins.items())}
    return out


def foil_table(name: str, accuracy: dict[str, dict[str, float]]) -> str:
    kinds = sorted({k for by_kind in accuracy.values() for k in by_kind}, key=lambda k: (k == "all", k))
    rows = [[label, *(f"{by_kind.get(k, float('nan')):.3f}" for k in kinds)] for label, by_kind in accuracy.items()]
    return f"world-foil accuracy of {name} (val; chance 0.5):\n" + format_table(["captions", *kinds], rows)
