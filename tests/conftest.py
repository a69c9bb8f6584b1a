"""Shared fixtures: a tiny offline world and a small Karpathy-format COCO-like file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from features.world.generate import WorldConfig, generate

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco_val_1k.json"
needs_coco_1k = pytest.mark.skipif(not SHARED_DATA.exists(),
                                   reason=f"{SHARED_DATA} not present (shared/ beside the repo)")


def load_coco_1k() -> list[dict]:
    return json.loads(SHARED_DATA.read_text())


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    generate(WorldConfig(out=str(out), train=40, val=12, test=12, seed=7, workers=1), progress=False)
    return out


@pytest.fixture(scope="session")
def world_train(tiny_world):
    """The tiny world's train split and its scenes."""
    from features.world.scene import load_world_scenes
    from rewards.recipes.data import load_split

    train = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train")
    scenes, _ = load_world_scenes(str(tiny_world / "scenes.json"))
    return train, scenes


def write_karpathy_fixture(root: Path) -> Path:
    """A COCO-style Karpathy file: cocoid + filepath, a restval image, varied punctuation."""
    images = []
    captions = [
        ["A man's dog can't run (quickly) to the park.", "Two dogs play.", "A dog, a man and a ball!"],
        ["A RED bus on the street.", "the bus is red", "A bus; parked near a sign -- downtown."],
        ["Zebras grazing in a field.", "a zebra eats grass", "Zebras!"],
        ["A dog sits on a red bus.", "a man and a dog", "the man walks the dog"],
    ]
    splits = ["train", "restval", "val", "test"]
    (root / "val2014").mkdir(parents=True, exist_ok=True)
    for k, (caps, split) in enumerate(zip(captions, splits, strict=True)):
        filename = f"COCO_val2014_{k:012d}.jpg"
        Image.fromarray(np.full((32, 40, 3), 40 * k, dtype=np.uint8)).save(root / "val2014" / filename)
        images.append({
            "imgid": k, "cocoid": 1000 + k, "filepath": "val2014", "filename": filename, "split": split,
            "sentences": [{"raw": c, "tokens": c.lower().split(), "imgid": k, "sentid": 10 * k + j}
                          for j, c in enumerate(caps)],
        })
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    return path


@pytest.fixture()
def karpathy_file(tmp_path) -> Path:
    return write_karpathy_fixture(tmp_path)


@pytest.fixture(scope="session")
def coco_stand_in(tmp_path_factory):
    """The COCO rehearsal's inputs on 40 images: real COCO captions, JPEGs at COCO's sizes, and
    ViT-B-32, LongCLIP-B and the L-CLIP student at their real sizes with random weights."""
    from features.coco_rehearsal import build_rehearsal_set

    return build_rehearsal_set(tmp_path_factory.mktemp("coco_inputs") / "inputs", images=40)
