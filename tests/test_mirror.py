"""Mirrored views: a flipped image with its texts rewritten stays true (and its negatives false)
of the flipped scene, judged by the world parser; twins with one caption are not each other's
negatives."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from features.world.negatives import KINDS, hard_negatives
from features.world.parse import contradictions, parse_caption
from features.world.scene import Scene, load_scenes, place_name, relations_between
from rewards.recipes.contrastive import negclip_loss
from rewards.recipes.data import TextsDataset, load_split
from rewards.recipes.mirror import flips, mirror_text

AXES_SETS = flips(("horizontal", "vertical"))


def mirrored_scene(scene: Scene, axes: tuple[str, ...]) -> Scene:
    size = scene.image_size
    objects = []
    for obj in scene.objects:
        x, y = obj.center
        x = size - x if "horizontal" in axes else x
        y = size - y if "vertical" in axes else y
        objects.append(replace(obj, center=(x, y), place=place_name(x, y, size)))
    relations = [{"subject": a.id, "relation": rel, "object": b.id}
                 for a in objects for b in objects if a.id != b.id for rel in relations_between(a, b, size)]
    return replace(scene, objects=objects, relations=relations)


def test_mirror_text_swaps_position_words_and_keeps_case():
    flipped = mirror_text("Left of the Top right corner, above.", ("horizontal",))
    assert flipped == "Right of the Top left corner, above."
    assert mirror_text("a star under a circle at the bottom", ("vertical",)) == "a star over a circle at the top"
    assert mirror_text("a bright star", ("horizontal", "vertical")) == "a bright star"  # whole words only


def test_a_mirrored_caption_is_true_and_its_negatives_false_of_the_mirrored_scene(tiny_world):
    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    scenes = load_scenes(tiny_world / "scenes.json")
    rng = random.Random(0)
    changed = 0
    for image in images:
        scene = scenes[image["imgid"]]
        texts = [s["raw"] for s in image["sentences"]] + [c["raw"] for c in image["long_captions"]]
        for axes in AXES_SETS:
            flipped = mirrored_scene(scene, axes)
            for text in texts:
                mirrored = mirror_text(text, axes)
                changed += mirrored != text
                assert contradictions(parse_caption(mirrored), flipped) == [], (axes, text, mirrored)
                for negative in hard_negatives(text, scene, rng, count=len(KINDS)):
                    assert contradictions(parse_caption(mirror_text(negative.text, axes)), flipped), negative
    assert changed > 0


def test_pairs_hold_the_image_and_its_flipped_twin_with_texts_to_match(tiny_world):
    split = load_split(str(tiny_world / "dataset.json"), str(tiny_world), "train", limit=6)
    dataset = TextsDataset(split, lambda im: torch.from_numpy(np.asarray(im).copy()),
                           lambda row, rng: [split.long[row][0], split.short[row][0]], seed=0, mirror="pairs",
                           mirror_axes=("horizontal", "vertical"))
    flip_dims = {("horizontal",): [1], ("vertical",): [0], ("horizontal", "vertical"): [0, 1]}  # HWC pixels
    for row in range(len(split)):
        view, twin_view = dataset[row]
        image, texts, twin, twin_texts = view.image, view.texts, twin_view.image, twin_view.texts
        axes = [a for a, dims in flip_dims.items() if torch.equal(twin, torch.flip(image, dims=dims))]
        assert len(axes) == 1, "the twin is the image flipped along one set of axes"
        assert twin_texts == [mirror_text(t, axes[0]) for t in texts]
        can_change = any(mirror_text(texts[0], a) != texts[0] for a in flip_dims)
        assert (twin_texts[0] != texts[0]) == can_change  # a twin that reads the same only when none can differ


def test_twins_with_one_caption_are_not_each_others_negatives():
    image = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [1.0, -0.2]]), dim=-1)
    caption = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0]]), dim=-1)
    text = caption.expand(2, 1, 2).clone()
    mask = torch.ones(2, 1, dtype=torch.bool)
    scale = torch.tensor(2.0)
    assert negclip_loss(image, text, mask, scale) == pytest.approx(float(torch.log(torch.tensor(2.0))), abs=1e-6)
    assert negclip_loss(image, text, mask, scale, torch.tensor([7, 7])) == pytest.approx(0.0, abs=1e-7)
    assert negclip_loss(image, text, mask, scale, torch.tensor([7, 8])) > 0.5
