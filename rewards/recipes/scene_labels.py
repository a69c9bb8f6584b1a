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
(docs/reward_models.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from features.world import lexicon
from features.world.scene import Scene
from rewards.recipes.data import ImagesWithTargets, Split, collate_targets
from rewards.recipes.loop import RecipeRun, Stage, to_channels_last

KINDS = [(shape, color) for shape in lexicon.SHAPES for color in lexicon.COLORS]
PLACES = list(lexicon.PLACES.values())
PER_KIND = ["present", *lexicon.SIZES, *lexicon.TEXTURES, *PLACES]
BACKGROUNDS = list(lexicon.BACKGROUNDS)
COUNTS = [1, 2, 3, 4]
PER_CELL = ["occupied", *lexicon.SHAPES, *lexicon.COLORS]
CELLS_AT = len(KINDS) * len(PER_KIND) + len(BACKGROUNDS) + len(COUNTS)  # where the cell block starts
LABELS = CELLS_AT + len(PLACES) * len(PER_CELL)


def scene_label(scene: Scene) -> torch.Tensor:
    """The scene's label vector [LABELS] of 0/1."""
    label = torch.zeros(LABELS)
    for obj in scene.objects:
        base = KINDS.index((obj.shape, obj.color)) * len(PER_KIND)
        for fact in ("present", obj.size, obj.texture, obj.place):
            label[base + PER_KIND.index(fact)] = 1.0
    rest = len(KINDS) * len(PER_KIND)
    label[rest + BACKGROUNDS.index(scene.background)] = 1.0
    if len(scene.objects) in COUNTS:
        label[rest + len(BACKGROUNDS) + COUNTS.index(len(scene.objects))] = 1.0
    for obj in scene.objects:
        cell = CELLS_AT + PLACES.index(obj.place) * len(PER_CELL)
        for fact in ("occupied", obj.shape, obj.color):
            label[cell + PER_CELL.index(fact)] = 1.0
    return label


class SceneProbe(torch.nn.Module):
    """An image tower with a linear head onto the scene labels."""

    def __init__(self, visual: torch.nn.Module, embed_dim: int):
        super().__init__()
        self.visual = visual
        self.head = torch.nn.Linear(embed_dim, LABELS)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.visual(to_channels_last(images)))


def scene_label_step(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
    """Binary cross-entropy summed over the labels, averaged over images."""
    logits = model(batch["images"])
    loss = F.binary_cross_entropy_with_logits(logits.float(), batch["targets"], reduction="sum") / len(logits)
    with torch.no_grad():
        exact = ((logits > 0) == (batch["targets"] > 0.5)).all(dim=1).float().mean()
    return loss, {"exact_labels": float(exact)}


def pretrain_on_scene_labels(run: RecipeRun, visual: torch.nn.Module, width: int, split: Split, transform: Callable,
                             scenes: dict[int, Scene], epochs: int) -> None:
    """Train an image tower (output width `width`) to predict the scene labels for `epochs`, as the
    resumable stage "vision" of `run` at the recipe's lr and warmup; the head is dropped afterwards,
    the tower keeps what it learned."""
    probe = SceneProbe(visual, width)
    stage = Stage("vision", epochs, run.cfg.lr, run.cfg.warmup_steps)
    labels = [scene_label(scenes[image_id]) for image_id in split.image_ids]
    run.fit(probe, ImagesWithTargets(split, transform, labels), collate_targets, scene_label_step, stage)
