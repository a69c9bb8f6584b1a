"""Supervised pretraining of an image tower on the world's scene graphs (LiT-style: contrastive
training then starts from an image tower that already sees the scene).

Each train image's label vector says which objects it holds, named by (shape, colour), and for each
of them its size, texture and place on the 3x3 grid, plus the background and the object count; and,
cell by cell of that grid, whether an object is there and its shape and colour. A linear head on
the image embedding predicts every bit (binary cross-entropy), so the embedding must carry which
attribute belongs to which object and where each one is. Labels come from scenes.json on the train
split only.

Why the cell block: the per-kind place bits ("a red star in the top left") are 504 conjunctions,
each rarely on, and the tower did not learn them (a head read a present object's cell 0.13 of the
time, chance 0.11). Each cell's own bits are on far more often; with them, and the pool's position
embedding drawn wider (`pool_position_std`), the embedding carries place and binding
(docs/lab_book.md).

With `map_weight` (`vision_map_labels`), a second head reads each place of the tower's last feature
map (what a ResNet's pool reads) and predicts the shape, colour, (shape, colour), size and texture of
the objects centred there: many more targets per image, each about one region, as the L-CLIP
student's hints are. An option: on the world it lifts shape by about 0.04 (three seeds) and is not yet the
default (docs/lab_book.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch
import torch.nn.functional as F

from features.world import lexicon
from features.world.scene import Scene
from rewards.recipes.data import ImagesWithTargets, Split, collate_targets
from rewards.recipes.feature_maps import last_map, last_map_shape
from rewards.recipes.loop import RecipeRun, Stage, to_channels_last

KINDS = [(shape, color) for shape in lexicon.SHAPES for color in lexicon.COLORS]
PLACES = list(lexicon.PLACES.values())
PER_KIND = ["present", *lexicon.SIZES, *lexicon.TEXTURES, *PLACES]
BACKGROUNDS = list(lexicon.BACKGROUNDS)
COUNTS = [1, 2, 3, 4]
PER_CELL = ["occupied", *lexicon.SHAPES, *lexicon.COLORS]
PER_PLACE = [*lexicon.SHAPES, *lexicon.COLORS, *KINDS, *lexicon.SIZES, *lexicon.TEXTURES]  # of the tower's map
CELLS_AT = len(KINDS) * len(PER_KIND) + len(BACKGROUNDS) + len(COUNTS)  # where the cell block starts
LABELS = CELLS_AT + len(PLACES) * len(PER_CELL)
_BACKGROUND_AT = len(KINDS) * len(PER_KIND)


def _object_column(kind: int, fact: str) -> int:
    """Where the `objects` block holds one fact (PER_KIND) of the kind KINDS[kind]."""
    return kind * len(PER_KIND) + PER_KIND.index(fact)


def _per_kind(facts: Iterable[str]) -> list[int]:
    """The columns of `objects` that hold these facts, for every (shape, colour)."""
    return [_object_column(kind, fact) for kind in range(len(KINDS)) for fact in facts]


# The label vector's blocks, by the name a config gives them (`scene_label_groups`). `texture` and `size`
# are parts of `objects`, each object's bits of one kind alone: the contrastive stage loses texture from
# the embedding (3-pixel stripes and checks that in-batch captions rarely tell apart; docs/lab_book.md,
# "Texture on the image embedding").
LABEL_GROUPS = {"objects": range(0, _BACKGROUND_AT),
                "background": range(_BACKGROUND_AT, _BACKGROUND_AT + len(BACKGROUNDS)),
                "count": range(_BACKGROUND_AT + len(BACKGROUNDS), CELLS_AT),
                "cells": range(CELLS_AT, LABELS),
                "texture": _per_kind(lexicon.TEXTURES),
                "size": _per_kind(lexicon.SIZES)}
BLOCKS = ("objects", "background", "count", "cells")  # the groups that partition the label vector


def scene_label(scene: Scene) -> torch.Tensor:
    """The scene's label vector [LABELS] of 0/1."""
    label = torch.zeros(LABELS)
    for obj in scene.objects:
        kind = KINDS.index((obj.shape, obj.color))
        for fact in ("present", obj.size, obj.texture, obj.place):
            label[_object_column(kind, fact)] = 1.0
    label[LABEL_GROUPS["background"][BACKGROUNDS.index(scene.background)]] = 1.0
    if len(scene.objects) in COUNTS:
        label[LABEL_GROUPS["count"][COUNTS.index(len(scene.objects))]] = 1.0
    for obj in scene.objects:
        cell = CELLS_AT + PLACES.index(obj.place) * len(PER_CELL)
        for fact in ("occupied", obj.shape, obj.color):
            label[cell + PER_CELL.index(fact)] = 1.0
    return label


def map_label(scene: Scene, side: int) -> torch.Tensor:
    """[side², PER_PLACE] 0/1: for each place of the tower's last map (row by row), the facts of the
    objects whose centre falls there."""
    label = torch.zeros(side * side, len(PER_PLACE))
    for obj in scene.objects:
        x, y = obj.center
        place = min(int(side * y / scene.image_size), side - 1) * side + min(int(side * x / scene.image_size), side - 1)
        for fact in (obj.shape, obj.color, (obj.shape, obj.color), obj.size, obj.texture):
            label[place, PER_PLACE.index(fact)] = 1.0
    return label


class SceneProbe(torch.nn.Module):
    """An image tower with a linear head onto the scene labels and, with `map_channels`, one onto each
    place of its last feature map."""

    def __init__(self, visual: torch.nn.Module, embed_dim: int, map_channels: int = 0):
        super().__init__()
        self.visual = visual
        self.head = torch.nn.Linear(embed_dim, LABELS)
        self.map_head = torch.nn.Linear(map_channels, len(PER_PLACE)) if map_channels else None
        self.read_map = last_map(visual, "vision_map_labels") if map_channels else None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.read_map is None:
            return self.head(self.visual(to_channels_last(images)))
        out = self.read_map(images)
        places = out["map"].flatten(2).transpose(1, 2)  # [B, h*w, C], row by row
        return torch.cat([self.head(out["embedding"]), self.map_head(places).flatten(1)], dim=1)


def scene_label_step(model: torch.nn.Module, batch: dict, map_weight: float = 0.0
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """The scene-label loss (`scene_label_loss`) plus, where present, the map's labels' binary
    cross-entropy weighted by `map_weight`."""
    logits, targets = model(batch["images"]).float(), batch["targets"]
    logits, map_logits = logits[:, :LABELS], logits[:, LABELS:]
    targets, map_targets = targets[:, :LABELS], targets[:, LABELS:]
    loss = scene_label_loss(logits, targets)
    with torch.no_grad():
        exact = ((logits > 0) == (targets > 0.5)).all(dim=1).float().mean()
    parts = {"exact_labels": float(exact)}
    if map_weight:
        map_loss = F.binary_cross_entropy_with_logits(map_logits, map_targets, reduction="sum") / len(logits)
        loss = loss + map_weight * map_loss
        parts["map_loss"] = map_loss.item()
    return loss, parts


def scene_label_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy summed over the labels, averaged over images."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="sum") / len(logits)


def label_columns(groups: list[str]) -> torch.Tensor:
    """The columns of the label vector that the named groups (LABEL_GROUPS) cover, in order, each once
    (`texture` lies inside `objects`)."""
    columns = [column for group in LABEL_GROUPS if group in groups for column in LABEL_GROUPS[group]]
    return torch.tensor(list(dict.fromkeys(columns)))


def scene_labels(split: Split, scenes: dict[int, Scene]) -> torch.Tensor:
    """[rows of the split, LABELS]: each image's scene label."""
    return torch.stack([scene_label(scenes[image_id]) for image_id in split.image_ids])


def pretrain_on_scene_labels(run: RecipeRun, visual: torch.nn.Module, width: int, split: Split, transform: Callable,
                             scenes: dict[int, Scene], epochs: int, map_weight: float = 0.0) -> torch.nn.Linear:
    """Train an image tower (output width `width`) to predict the scene labels for `epochs`, as the
    resumable stage "vision" of `run` at the recipe's lr and warmup; with `map_weight`, each place of
    its last feature map also predicts what is centred there. The tower keeps what it learned; the
    embedding's head comes back (a recipe may keep training it), the map's is dropped."""
    labels = list(scene_labels(split, scenes))
    channels = 0
    if map_weight:
        channels, side = last_map_shape(visual, "vision_map_labels", next(visual.parameters()).device)
        labels = [torch.cat([label, map_label(scenes[image_id], side).flatten()])
                  for label, image_id in zip(labels, split.image_ids, strict=True)]
    probe = SceneProbe(visual, width, channels)
    stage = Stage("vision", epochs, run.cfg.lr, run.cfg.warmup_steps)
    step = partial(scene_label_step, map_weight=map_weight)
    run.fit(probe, ImagesWithTargets(split, transform, labels), collate_targets, step, stage)
    return probe.head
