"""Counterfactual scenes (hard image negatives): one fact changed, false of the caption by the
parser, drawn with the original image's background and noise."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import torch
from PIL import Image

from features.world import counterfactual as cf
from features.world.parse import contradictions, parse_caption
from features.world.scene import load_scenes, load_world_scenes, place_name, relations_between
from rewards.recipes.contrastive import negclip_loss
from tests.test_negatives import _captions


def _facts(scene) -> Counter:
    facts = Counter({("background", scene.background): 1})
    for o in scene.objects:
        facts.update({("object", o.shape, o.color, o.size, o.texture, o.place): 1})
    return facts


def test_every_counterfactual_is_false_of_the_caption_and_a_consistent_scene(tiny_world):
    rng = random.Random(0)
    made = 0
    for text, scene in _captions(tiny_world):
        claims = parse_caption(text)
        edited = cf.counterfactual(scene, claims, rng)
        if edited is None:
            continue
        made += 1
        assert contradictions(claims, edited), (text, edited)
        size = edited.image_size
        for o in edited.objects:
            assert o.place == place_name(*o.center, size)
            others = [p for p in edited.objects if p.id != o.id]
            assert cf._fits(o.center, o.radius, others, size), (text, o)  # inside, and overlapping nothing
            assert len({(p.shape, p.color) for p in edited.objects}) == len(edited.objects)  # names stay unique
        expected = [{"subject": a.id, "relation": r, "object": b.id} for a in edited.objects for b in edited.objects
                    if a.id != b.id for r in relations_between(a, b, size)]
        assert edited.relations == expected
    assert made >= 0.95 * sum(1 for _ in _captions(tiny_world))


def test_each_edit_changes_one_fact(tiny_world):
    """Attribute edits touch one object's one attribute; every kind of edit gets made."""
    scenes = load_scenes(tiny_world / "scenes.json")
    rng = random.Random(1)
    made = Counter()
    for scene in scenes.values():
        for kind, edit in cf._EDIT.items():
            edited = edit(scene, rng)
            if edited is None:
                continue
            made[kind] += 1
            before, after = _facts(scene), _facts(edited)
            if kind in ("shape", "color", "size", "texture", "background"):
                assert sum((before - after).values()) == 1 and sum((after - before).values()) == 1, (kind, scene)
            if kind in ("remove", "add"):
                assert abs(len(edited.objects) - len(scene.objects)) == 1
            if kind in ("move", "swap"):
                assert sorted((o.shape, o.color) for o in edited.objects) == sorted(
                    (o.shape, o.color) for o in scene.objects)
                assert edited.objects != scene.objects
    assert set(made) == set(cf.EDITS), made


def test_an_unedited_rerender_is_the_image_on_disk(tiny_world):
    scenes, seed = load_world_scenes(tiny_world / "scenes.json")
    assert seed == 7
    images = json.loads((tiny_world / "dataset.json").read_text())["images"]
    for image in images[:10]:
        scene = scenes[image["imgid"]]
        on_disk = np.asarray(Image.open(tiny_world / image["filepath"] / image["filename"]).convert("RGB"))
        assert np.array_equal(np.asarray(cf.rerender(scene, scene, seed, image["imgid"])), on_disk)
        edited = cf._texture(scene, random.Random(image["imgid"]))
        differs = np.asarray(cf.rerender(scene, edited, seed, image["imgid"])) != on_disk
        assert differs.any() and not differs.all()  # the edited object changed, the background did not


def test_image_negatives_enter_text_to_image_only():
    """A caption ranked against a picture close to its own image costs more than without it; the
    image->text half is untouched."""
    torch.manual_seed(0)
    image = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    text = torch.nn.functional.normalize(image[:, None] + 0.3 * torch.randn(4, 2, 8), dim=-1)
    mask = torch.ones(4, 2, dtype=torch.bool)
    scale = torch.tensor(2.0)
    close = torch.nn.functional.normalize(text[:, 0] + 0.05 * torch.randn(4, 8), dim=-1)
    plain = negclip_loss(image, text, mask, scale)
    with_negatives = negclip_loss(image, text, mask, scale, image_negatives=close)
    assert with_negatives > plain
    assert torch.equal(negclip_loss(image, text, mask, scale, image_negatives=close[:0]), plain)


def test_scene_labels_name_every_object_with_its_facts(tiny_world):
    """The pretraining labels (rewards.recipes.scene_labels) decode back to the scene."""
    from features.world.lexicon import SIZES, TEXTURES
    from rewards.recipes.scene_labels import (
        BACKGROUNDS,
        CELLS_AT,
        COUNTS,
        KINDS,
        LABELS,
        PER_CELL,
        PER_KIND,
        PLACES,
        label_columns,
        scene_label,
    )

    for scene in load_scenes(tiny_world / "scenes.json").values():
        label = scene_label(scene)
        assert label.shape == (LABELS,) and float(label[:CELLS_AT].sum()) == 4 * len(scene.objects) + 2
        cells = label[CELLS_AT:].view(len(PLACES), len(PER_CELL))
        for place, bits in zip(PLACES, cells, strict=True):
            said = {PER_CELL[j] for j in range(len(PER_CELL)) if bits[j]}
            there = [o for o in scene.objects if o.place == place]
            truth = {"occupied"} | {o.shape for o in there} | {o.color for o in there} if there else set()
            assert said == truth, (place, said, truth)
        per_kind = label[: len(KINDS) * len(PER_KIND)].view(len(KINDS), len(PER_KIND))
        decoded = {(KINDS[k], *(PER_KIND[j] for j in range(1, len(PER_KIND)) if per_kind[k, j]))
                   for k in range(len(KINDS)) if per_kind[k, 0]}
        assert decoded == {((o.shape, o.color), o.size, o.texture, o.place) for o in scene.objects}
        rest = label[len(KINDS) * len(PER_KIND):]
        assert BACKGROUNDS[int(rest[: len(BACKGROUNDS)].argmax())] == scene.background
        assert COUNTS[int(rest[len(BACKGROUNDS):].argmax())] == len(scene.objects)
        kept = label[label_columns(["background"])]  # what `scene_label_groups: [background]` keeps
        assert kept.tolist() == [float(b == scene.background) for b in BACKGROUNDS]
        textures = label[label_columns(["texture"])].view(len(KINDS), len(TEXTURES))
        assert {(KINDS[k], TEXTURES[t]) for k, t in textures.nonzero().tolist()} == \
            {((o.shape, o.color), o.texture) for o in scene.objects}
        sizes = label[label_columns(["size"])].view(len(KINDS), len(SIZES))
        assert {(KINDS[k], list(SIZES)[t]) for k, t in sizes.nonzero().tolist()} == \
            {((o.shape, o.color), o.size) for o in scene.objects}
    assert torch.equal(label_columns(["cells", "objects", "count", "background"]), torch.arange(LABELS))
    # `texture` and `size` lie inside `objects`: named beside it, each column is kept once
    every_group = ["texture", "objects", "size", "count", "background", "cells"]
    assert torch.equal(label_columns(every_group), torch.arange(LABELS))
