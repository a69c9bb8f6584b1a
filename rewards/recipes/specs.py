"""SPECS's specificity fine-tuning (papers/specs_paper.txt §3.3): a CLIP stretched to 248 text
positions by the LongCLIP rule is trained with

    L = α·L_contrastive + β·L_pos + γ·L_neg                                          (Eq. 4)
    L_pos = mean max(0, θ(i, c_j) − θ(i, c_j + d₊) + ε₊)                              (Eq. 3)
    L_neg = mean max(0, θ(i, c_j + d₋) − θ(i, c_j) + ε₋)

with ε the detached batch mean of the wanted gap, clamped to [0, max_margin], and θ the
logit-scaled cosine (as the released code). Triplets come from detail units (the world records
them; `rewards.recipes.detail_units` segments any caption). The result is written in the SPECS layout
(`spec.pt`: OpenAI-CLIP keys + positional_embedding_res) and loads with kind `longclip`; the
starting model can be written too, so `rewards.recipes.specificity` can compare the two.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from tqdm import tqdm

from features.clip_models.factory import clip_text_forward
from features.clip_models.longclip import (
    LONG_CONTEXT,
    load_longclip,
    longclip_from_state,
    longclip_state,
    stretch_state_dict,
)
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.tokens import ClipTokenizer
from plumbing.atomic import append_line, to_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError, DataError
from rewards.recipes.contrastive import info_nce
from rewards.recipes.data import load_split
from rewards.recipes.specificity import (
    detail_units_of,
    join_units,
    sample_triplets,
    scene_negative_filter,
)
from rewards.recipes.training import optimizer_and_schedule, save_pt, start, trim_log


@dataclass
class TrainSpecsConfig:
    init: str = option("", help="starting weights: an open_clip file (stretched here) or a LongCLIP/SPECS .pt")
    init_kind: Literal["open_clip", "longclip"] = option("open_clip", help="what `init` holds")
    arch: str = option("world-clip-tiny", help="open_clip architecture of `init` (init_kind open_clip)")
    dataset: str = option("", help="Karpathy-format dataset.json with long_captions.detail_units")
    images_root: str = option("", help="folder the dataset's image paths are relative to")
    out: str = option("", help="output SPECS checkpoint (.pt, the released spec.pt layout)")
    start_out: str | None = option(None, help="also write the starting (stretched) model here, same layout")
    epochs: int = option(3, help="training epochs", at_least=1)
    batch_size: int = option(64, help="images per step", at_least=2)
    lr: float = option(1e-4, help="peak learning rate (warmup, then cosine to 0)", above=0)
    weight_decay: float = option(0.01, help="AdamW weight decay", at_least=0)
    warmup_steps: int = option(20, help="linear warmup steps", at_least=0)
    alpha: float = option(1.0, help="weight of the contrastive loss (Eq. 4)", at_least=0)
    beta: float = option(8.0, help="weight of the positive detail hinge L_pos", at_least=0)
    gamma: float = option(0.8, help="weight of the negative detail hinge L_neg", at_least=0)
    max_margin: float = option(1.5, help="clamp of the dynamic margin (logit units)", at_least=0)
    shuffle_ratio: float = option(0.9, help="share of negative units whose words are shuffled", at_least=0, at_most=1)
    scenes: str | None = option(None, help="offline world scenes.json: negatives must name an object the image lacks")
    max_train_images: int = option(0, help="use at most this many train images (0 = all)", at_least=0)
    seed: int = option(0, help="random seed")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    workers: int = option(2, help="image-decoding worker processes", at_least=0)


def dynamic_margin_hinge(bigger: torch.Tensor, smaller: torch.Tensor, max_margin: float) -> tuple[torch.Tensor, float]:
    """mean max(0, smaller − bigger + ε), ε = clamp(detach(mean(bigger − smaller)), 0, max_margin)."""
    margin = (bigger - smaller).mean().detach().clamp(0.0, max_margin)
    return F.relu(smaller - bigger + margin).mean(), float(margin)


def specs_loss(logit_scale: torch.Tensor, image: torch.Tensor, caption: torch.Tensor, base: torch.Tensor,
               positive: torch.Tensor, negative: torch.Tensor, cfg: TrainSpecsConfig) -> tuple[torch.Tensor, dict]:
    """All embeddings normalised; row i of every text tensor belongs to image i."""
    scale = logit_scale.exp()

    def theta(text: torch.Tensor) -> torch.Tensor:
        return scale * (image * text).sum(-1)

    contrastive = info_nce(image, caption, logit_scale)
    base_sim = theta(base)
    pos, pos_margin = dynamic_margin_hinge(theta(positive), base_sim, cfg.max_margin)
    neg, neg_margin = dynamic_margin_hinge(base_sim, theta(negative), cfg.max_margin)
    loss = cfg.alpha * contrastive + cfg.beta * pos + cfg.gamma * neg
    return loss, {"contrastive": contrastive.item(), "pos": pos.item(), "neg": neg.item(),
                  "pos_margin": pos_margin, "neg_margin": neg_margin}


def starting_model(cfg: TrainSpecsConfig):
    if cfg.init_kind == "longclip":
        return load_longclip(cfg.init)
    loaded = load_open_clip(cfg.arch, cfg.init)
    return longclip_from_state(stretch_state_dict(loaded.model.state_dict()), f"{cfg.init} (stretched)")


def train_specs(cfg: TrainSpecsConfig, progress: bool = True) -> dict:
    _validate(cfg)
    device = start(cfg.seed, cfg.device, Path(cfg.out), cfg.out, progress)
    if device is None:
        return {"out": cfg.out, "start_out": cfg.start_out, "skipped": True}
    model = starting_model(cfg)
    if cfg.start_out:
        save_pt(longclip_state(model), cfg.start_out)
    model = model.to(device).train()
    from open_clip.transform import image_transform

    train = load_split(cfg.dataset, cfg.images_root, "train", image_transform(model.visual.image_size, False),
                       cfg.max_train_images, cfg.workers, need_long=True, progress=progress)
    units = _units_by_row(cfg.dataset, train.entries)
    rows_with_units = [k for k, u in enumerate(units) if u]
    tokenizer = ClipTokenizer(LONG_CONTEXT)
    text_forward = clip_text_forward(model)
    steps_per_epoch = -(-len(rows_with_units) // cfg.batch_size)
    optimizer, scheduler = optimizer_and_schedule(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps,
                                                  steps_per_epoch * cfg.epochs)
    rng = random.Random(cfg.seed)
    allowed = None
    if cfg.scenes:
        from features.world.scene import load_scenes

        allowed = scene_negative_filter(load_scenes(cfg.scenes), train.image_ids)
    log_path = Path(cfg.out).with_suffix(".log.jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    trim_log(log_path, 0)  # this recipe restarts from scratch: an interrupted run's lines go

    def embed(texts: list[str]) -> torch.Tensor:
        return F.normalize(text_forward(tokenizer.padded(tokenizer.ids(texts)).to(device)), dim=-1)

    for epoch in range(cfg.epochs):
        order = rows_with_units[:]
        rng.shuffle(order)
        bar = tqdm(range(0, len(order), cfg.batch_size), desc=f"specs epoch {epoch + 1}/{cfg.epochs}",
                   disable=not progress)
        sums: dict[str, float] = {}
        for begin in bar:
            rows = order[begin: begin + cfg.batch_size]
            if len(rows) < 2:
                continue
            batch_units = [units[r] for r in rows]
            batch_allowed = (lambda unit, k, rows=rows: allowed(unit, rows[k])) if allowed else None
            triplets = sample_triplets(batch_units, rng, cfg.shuffle_ratio, batch_allowed)
            image = F.normalize(model.encode_image(train.images[rows].to(device)), dim=-1)
            loss, parts = specs_loss(model.logit_scale, image, embed([join_units(u) for u in batch_units]),
                                     embed(triplets.base), embed(triplets.positive), embed(triplets.negative), cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            for key, value in {"loss": loss.item(), **parts}.items():
                sums[key] = sums.get(key, 0.0) + value
            bar.set_postfix(loss=f"{loss.item():.3f}", pos=f"{parts['pos']:.3f}", neg=f"{parts['neg']:.3f}")
        record = {"epoch": epoch + 1, **{k: v / steps_per_epoch for k, v in sums.items()}}
        append_line(log_path, to_json(record))
        if progress:
            print(json.dumps(record))
    save_pt(longclip_state(model), cfg.out)
    return {"out": cfg.out, "start_out": cfg.start_out, "truncated_captions": tokenizer.truncated}


def _units_by_row(dataset: str, entries: list) -> list[list[str]]:
    units = [(detail_units_of(e) or [[]])[0] for e in entries]
    if sum(1 for u in units if u) < 2:
        raise DataError(f"{dataset}: fewer than two training images have long captions with >= 2 detail units "
                        "('long_captions': [{'raw', 'detail_units'}]); segment captions with rewards.detail_units")
    return units


def _validate(cfg: TrainSpecsConfig) -> None:
    require_keys(cfg, ("init", "dataset", "images_root", "out"), "train_specs")
    if not 0.0 <= cfg.shuffle_ratio <= 1.0:
        raise ConfigError(f"shuffle_ratio must be in [0, 1], got {cfg.shuffle_ratio}")
    if cfg.batch_size < 2:
        raise ConfigError("batch_size must be >= 2 (negatives come from other images of the batch)")
