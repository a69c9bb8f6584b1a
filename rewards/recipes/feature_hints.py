"""Hints for the L-CLIP student's image tower (FitNets, Romero et al. 2015): before stage 1 its patch
tokens learn to predict the teacher's last feature map, place by place, through a linear adapter
that is dropped afterwards.

Why: L_D compares one embedding per image, and a changed shape moves that embedding only a little,
so the student learned colour from it but not shape (docs/reward_models.md). The teacher's last map
(what a ResNet's attention pool reads, or a ViT's last patch tokens) says at every place what is
there: many more numbers per image, each about one region. Both maps are pooled to the coarser of
the two grids and compared token by token after a layer norm, so the loss does not depend on the
teacher's feature scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from features.clip_models.lclip import LClipVision
from rewards.recipes.data import ImagesWithTargets, Split, collate_targets, image_batches, raise_errors
from rewards.recipes.feature_maps import last_map, last_map_shape
from rewards.recipes.loop import RecipeRun, Stage, to_channels_last


def student_side(tower: LClipVision) -> int:
    return math.isqrt(tower.positional_embedding.shape[0] - 1)


def hint_side(visual: nn.Module, student: int, device: torch.device) -> int:
    """The coarser of the student's grid side and the teacher's last map's."""
    return min(student, last_map_shape(visual, "hint_epochs", device)[1])


@torch.no_grad()
def teacher_hints(visual: nn.Module, split: Split, transform: Callable, side: int, device: torch.device,
                  workers: int, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's last map of every image of `split`, pooled to side x side: [N, side², C], each
    token layer-normed; and, from the same forward, its image embeddings [N, d] (not normalised)."""
    grid = last_map(visual, "hint_epochs", embedding=True)
    maps, embeddings = [], []
    for batch in image_batches(split, transform, workers, batch_size):
        raise_errors(batch)
        out = grid(batch["images"].to(device))
        pooled = F.adaptive_avg_pool2d(out["map"].float(), side).flatten(2).transpose(1, 2)
        # a tiny eps: an untrained teacher's maps can be small, and the default eps would flatten them
        maps.append(F.layer_norm(pooled, pooled.shape[-1:], eps=1e-12).cpu())
        embeddings.append(out["embedding"].float().cpu())
    return torch.cat(maps), torch.cat(embeddings)


class HintProbe(nn.Module):
    """The student's image tower, its patch tokens pooled to the hints' grid, a linear adapter to
    the teacher's channels."""

    def __init__(self, tower: LClipVision, channels: int, side: int):
        super().__init__()
        self.tower, self.side = tower, side
        self.adapter = nn.Linear(tower.positional_embedding.shape[1], channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = self.tower.tokens(to_channels_last(images))[:, 1:]
        batch, count, width = patches.shape
        own = math.isqrt(count)
        grid = patches.transpose(1, 2).reshape(batch, width, own, own)
        return self.adapter(F.adaptive_avg_pool2d(grid, self.side).flatten(2).transpose(1, 2))


def hint_step(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean squared error between the layer-normed predicted tokens and the teacher's."""
    predicted = model(batch["images"]).float()
    predicted = F.layer_norm(predicted, predicted.shape[-1:])
    target = batch["targets"]
    loss = F.mse_loss(predicted, target)
    with torch.no_grad():
        cosine = F.cosine_similarity(predicted, target, dim=-1).mean()
    return loss, {"hint_cosine": float(cosine)}


def pretrain_on_hints(run: RecipeRun, tower: LClipVision, teacher_visual: nn.Module, split: Split,
                      transform: Callable, epochs: int, workers: int, fit_projection: bool = False) -> None:
    """Train `tower` on the teacher's feature maps of `split` for `epochs`, as the resumable stage
    "hints" of `run`; the adapter is dropped afterwards. With `fit_projection`, the tower's output
    projection then starts as the least-squares readout of the teacher's embeddings (`readout_projection`)."""
    side = hint_side(teacher_visual, student_side(tower), run.device)
    hints, embeddings = teacher_hints(teacher_visual, split, transform, side, run.device, workers)
    probe = HintProbe(tower, hints.shape[-1], side)
    stage = Stage("hints", epochs, run.cfg.lr, run.cfg.warmup_steps)
    run.fit(probe, ImagesWithTargets(split, transform, hints), collate_targets, hint_step, stage)
    if fit_projection:
        readout_projection(tower, embeddings, split, transform, run.device, workers)


@torch.no_grad()
def readout_projection(tower: LClipVision, targets: torch.Tensor, split: Split, transform: Callable,
                       device: torch.device, workers: int, ridge: float = 1e-3) -> None:
    """Set the tower's projection to the ridge readout of `targets` (the teacher's image embeddings
    of `split`, row by row) from the tower's normed class token. Why: the hints teach the patch
    tokens, and the projection is still random; stage 1 then spends its first epochs (how many
    depends on the seed) finding the map a linear solve gives at once."""
    was_training = tower.training
    tower.eval()
    features = []
    for batch in image_batches(split, transform, workers, 256):
        raise_errors(batch)
        images = to_channels_last(batch["images"].to(device))
        features.append(tower.ln_post(tower.tokens(images)[:, 0]).float().cpu())
    tower.train(was_training)
    x, y = torch.cat(features).double(), targets.double()
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
    tower.proj.copy_(torch.linalg.solve(gram, x.T @ y).to(tower.proj.dtype))
