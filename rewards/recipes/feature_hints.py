"""Hints for the L-CLIP student's image tower (FitNets, Romero et al. 2015): before stage 1 its patch
tokens learn to predict the teacher's last feature map, place by place, through a linear adapter
that is dropped afterwards.

Why: L_D compares one embedding per image, and a changed shape moves that embedding only a little,
so the student learned colour from it but not shape (docs/lab_book.md). The teacher's last map
(what a ResNet's attention pool reads, or a ViT's last patch tokens) says at every place what is
there: many more numbers per image, each about one region. Both maps are pooled to the coarser of
the two grids and compared token by token after a layer norm, so the loss does not depend on the
teacher's feature scale.

With `EmbeddingTerms`, the stage also teaches the tower the teacher's image embedding: L_D, and a
squared error in the teacher's whitened embedding space. Why the second: the train images' embeddings
vary mostly along a few directions (16 of 256 hold 87% of the variance in the world CLIP), while a
relation foil's text difference lies almost wholly outside them (6% of its energy in those 16). A loss
in the raw space fits the loud directions first and the quiet ones only after many passes; whitened,
every direction the images vary along counts alike (docs/lab_book.md, "The student's quiet
directions").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from features.clip_models.lclip import LClipVision
from rewards.recipes.contrastive import distill_loss, embedding_spectrum
from rewards.recipes.data import ImagesWithTargets, Split, collate_targets, image_batches, raise_errors
from rewards.recipes.feature_maps import last_map, last_map_shape
from rewards.recipes.loop import RecipeRun, Stage, to_channels_last
from rewards.recipes.mirror import flips


def student_side(tower: LClipVision) -> int:
    return math.isqrt(tower.positional_embedding.shape[0] - 1)


def hint_side(visual: nn.Module, student: int, device: torch.device) -> int:
    """The coarser of the student's grid side and the teacher's last map's."""
    return min(student, last_map_shape(visual, "hint_epochs", device)[1])


def flip_images(images: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
    """[..., H, W] images mirrored on `axes` (horizontal: left-right, vertical: up-down). On a square
    image the preprocessing (resize, centre crop, per-channel normalisation) commutes with the flip, so
    flipping its tensor is flipping the picture."""
    dims = [d for axis, d in (("horizontal", -1), ("vertical", -2)) if axis in axes]
    return images.flip(dims) if dims else images


@torch.no_grad()
def teacher_hints(visual: nn.Module, split: Split, transform: Callable, side: int, device: torch.device,
                  workers: int, batch_size: int = 256, views: Sequence[tuple[str, ...]] = ((),)
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's last map of every image of `split` in each of `views` (flips; view-major rows),
    pooled to side x side: [V·N, side², C], each token layer-normed; and, from the same forward, its
    image embeddings [V·N, d] (not normalised)."""
    grid = last_map(visual, "hint_epochs", embedding=True)
    maps: list[list[torch.Tensor]] = [[] for _ in views]
    embeddings: list[list[torch.Tensor]] = [[] for _ in views]
    for batch in image_batches(split, transform, workers, batch_size):
        raise_errors(batch)
        for view, axes in enumerate(views):
            out = grid(flip_images(batch["images"], axes).to(device))
            pooled = F.adaptive_avg_pool2d(out["map"].float(), side).flatten(2).transpose(1, 2)
            # a tiny eps: an untrained teacher's maps can be small, and the default eps would flatten them
            maps[view].append(F.layer_norm(pooled, pooled.shape[-1:], eps=1e-12).cpu())
            embeddings[view].append(out["embedding"].float().cpu())
    return (torch.cat([m for view in maps for m in view]),
            torch.cat([e for view in embeddings for e in view]))


class FlippedViews(Dataset):
    """Every image of a split in each of `views` (view-major: all images unflipped first, when the
    first view is no flip), with the targets of that view: the hints' data when the teacher is asked
    about mirrored pictures too (its answers need no caption, so any flip is free)."""

    def __init__(self, split: Split, transform: Callable, targets: torch.Tensor | tuple[torch.Tensor, ...],
                 views: Sequence[tuple[str, ...]]):
        self.images = ImagesWithTargets(split, transform, torch.zeros(len(split)))
        self.views, self.targets = list(views), targets
        for column in targets if isinstance(targets, tuple) else (targets,):
            if len(column) != len(views) * len(split):
                raise ValueError(f"{len(column)} targets for {len(split)} images in {len(views)} views")

    def __len__(self) -> int:
        return len(self.views) * len(self.images)

    def set_epoch(self, epoch: int) -> None:  # the loop's hook; nothing here depends on the epoch
        pass

    def __getitem__(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | tuple[torch.Tensor, ...], str]:
        view, row = divmod(index, len(self.images))
        image, _, error = self.images[row]
        target = tuple(t[index] for t in self.targets) if isinstance(self.targets, tuple) else self.targets[index]
        return (None if image is None else flip_images(image, self.views[view])), target, error


class HintProbe(nn.Module):
    """The student's image tower, its patch tokens pooled to the hints' grid, a linear adapter to
    the teacher's channels; with `embedding`, also the tower's image embedding."""

    def __init__(self, tower: LClipVision, channels: int, side: int, embedding: bool = False):
        super().__init__()
        self.tower, self.side, self.embedding = tower, side, embedding
        self.adapter = nn.Linear(tower.positional_embedding.shape[1], channels)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The predicted map tokens [B, side², channels] and the tower's image embedding [B, d] (None
        without `embedding`: the hints alone never read it)."""
        tokens = self.tower.tokens(to_channels_last(images))
        patches = tokens[:, 1:]
        batch, count, width = patches.shape
        own = math.isqrt(count)
        grid = patches.transpose(1, 2).reshape(batch, width, own, own)
        embedding = self.tower.ln_post(tokens[:, 0]) @ self.tower.proj if self.embedding else None
        return self.adapter(F.adaptive_avg_pool2d(grid, self.side).flatten(2).transpose(1, 2)), embedding


@dataclass(frozen=True)
class EmbeddingTerms:
    """The hints stage's terms on the tower's image embedding, against the teacher's (both 0: none)."""

    ld_weight: float = 0.0        # L-CLIP's L_D (Eq. 1)
    whitened_weight: float = 0.0  # squared error of the normalised embeddings, whitened
    whiten_ridge: float = 0.1     # added to each eigenvalue, as a share of their mean

    @property
    def on(self) -> bool:
        return bool(self.ld_weight or self.whitened_weight)


def whitening(embeddings: torch.Tensor, ridge: float) -> torch.Tensor:
    """[d, d] ZCA whitening of the normalised `embeddings` ([N, d]): their covariance's eigenvalues,
    each raised by `ridge` times their mean (so that directions no image varies along are not blown
    up), to the power -1/2."""
    values, vectors = embedding_spectrum(embeddings)
    values = values + ridge * values.mean()
    return ((vectors * values.rsqrt()) @ vectors.T).float()


def whitened_error(teacher: torch.Tensor, student: torch.Tensor, whiten: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of the normalised embeddings ([B, d]) in the whitened space."""
    gap = F.normalize(student, dim=-1) - F.normalize(teacher, dim=-1)
    return (gap @ whiten.to(gap.dtype)).pow(2).mean()


def hint_step(model: nn.Module, batch: dict, terms: EmbeddingTerms = EmbeddingTerms(),
              whiten: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean squared error between the layer-normed predicted tokens and the teacher's; with `terms` on,
    plus the embedding terms (batch["targets"] is then (maps, embeddings); `whiten` is the teacher's
    whitening when terms.whitened_weight is set)."""
    target, teacher_embedding = batch["targets"] if terms.on else (batch["targets"], None)
    predicted, embedding = model(batch["images"])
    predicted = F.layer_norm(predicted.float(), predicted.shape[-1:])
    loss = F.mse_loss(predicted, target)
    with torch.no_grad():
        parts = {"hint_cosine": float(F.cosine_similarity(predicted, target, dim=-1).mean())}
    if teacher_embedding is None:
        return loss, parts
    embedding = embedding.float()
    image_ld = distill_loss(teacher_embedding, embedding)
    loss = loss + terms.ld_weight * image_ld
    parts["image_ld"] = image_ld.item()
    if terms.whitened_weight:
        whitened = whitened_error(teacher_embedding, embedding, whiten)
        loss = loss + terms.whitened_weight * whitened
        parts["whitened"] = whitened.item()
    return loss, parts


def pretrain_on_hints(run: RecipeRun, tower: LClipVision, teacher_visual: nn.Module, split: Split,
                      transform: Callable, epochs: int, workers: int, fit_projection: bool = False,
                      terms: EmbeddingTerms = EmbeddingTerms(), flip_axes: Sequence[str] = ()) -> None:
    """Train `tower` on the teacher's feature maps of `split` for `epochs`, as the resumable stage
    "hints" of `run`; the adapter is dropped afterwards. With `terms` on, the tower's image embedding
    also learns the teacher's (image side only: the teacher's embeddings come from the same one forward
    as its maps; the whitening is fitted on them, every view). With `fit_projection`, the tower's output
    projection then starts as the least-squares readout of the teacher's embeddings
    (`readout_projection`)."""
    side = hint_side(teacher_visual, student_side(tower), run.device)
    views = [(), *flips(tuple(flip_axes))]
    hints, embeddings = teacher_hints(teacher_visual, split, transform, side, run.device, workers, views=views)
    probe = HintProbe(tower, hints.shape[-1], side, embedding=terms.on)
    stage = Stage("hints", epochs, run.cfg.lr, run.cfg.warmup_steps)
    targets = (hints, embeddings) if terms.on else hints
    whiten = whitening(embeddings, terms.whiten_ridge).to(run.device) if terms.whitened_weight else None
    step = partial(hint_step, terms=terms, whiten=whiten)
    # without an embedding term the tower's output norm and projection get no gradient: left out, so that
    # DDP (several processes) does not wait for theirs
    unused = [] if terms.on else [tower.proj, *tower.ln_post.parameters()]
    for param in unused:
        param.requires_grad_(False)
    try:
        run.fit(probe, FlippedViews(split, transform, targets, views), collate_targets, step, stage)
    finally:
        for param in unused:
            param.requires_grad_(True)
    if fit_projection:  # on the pictures as they are: the first view's rows
        readout_projection(tower, embeddings[: len(split)], split, transform, run.device, workers)


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
        features.append(tower.pooled(images).float().cpu())
    tower.train(was_training)
    x, y = torch.cat(features).double(), targets.double()
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
    tower.proj.copy_(torch.linalg.solve(gram, x.T @ y).to(tower.proj.dtype))
