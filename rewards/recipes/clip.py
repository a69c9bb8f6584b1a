"""Contrastive training of an open_clip architecture (by default `world-clip-tiny`, registered from
rewards/model_configs) on a Karpathy-format dataset's images with their short and long captions.
It writes an open_clip state dict (safetensors) that loads through the same path as any user
checkpoint (`load_open_clip(arch, path)`), and reports image→text / text→image R@1 on val
against chance. Interrupted runs resume from the last finished epoch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from features.clip_models.factory import clip_text_forward
from features.clip_models.open_clip_models import load_open_clip
from features.clip_models.tokens import ClipTokenizer
from plumbing.atomic import append_line, to_json, write_json
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError
from rewards.recipes.contrastive import embed_images, embed_texts, info_nce, recall_at_1
from rewards.recipes.data import (
    CaptionKind,
    ImageCaptions,
    load_split,
    sample_captions,
)
from rewards.recipes.training import (
    optimizer_and_schedule,
    resume,
    save_state,
    save_weights,
    start,
    trim_log,
)

MAX_LOGIT_SCALE = math.log(100.0)


@dataclass
class TrainClipConfig:
    arch: str = option("world-clip-tiny", help="open_clip architecture (rlcap's world-clip-tiny or any open_clip name)")
    init: str | None = option(None, help="starting weights: a file or an open_clip hub tag (default: random init)")
    dataset: str = option("", help="Karpathy-format dataset.json")
    images_root: str = option("", help="folder the dataset's image paths are relative to")
    out: str = option("", help="output weights (.safetensors, open_clip state dict)")
    captions: CaptionKind = option("both", help="caption pool per image: short references, long captions or both")
    epochs: int = option(10, help="training epochs", at_least=1)
    batch_size: int = option(128, help="images per step (the contrastive batch)", at_least=2)
    lr: float = option(1e-3, help="peak learning rate (warmup, then cosine to 0)", above=0)
    weight_decay: float = option(0.1, help="AdamW weight decay (not on gains, biases, embeddings)", at_least=0)
    warmup_steps: int = option(50, help="linear warmup steps", at_least=0)
    max_train_images: int = option(0, help="use at most this many train images (0 = all)", at_least=0)
    max_val_images: int = option(500, help="val images for the R@1 report", at_least=0)
    seed: int = option(0, help="random seed")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")
    workers: int = option(2, help="image-decoding worker processes", at_least=0)


def train_clip(cfg: TrainClipConfig, progress: bool = True) -> dict:
    _validate(cfg)
    summary_path = Path(cfg.out).with_suffix(".json")
    device = start(cfg.seed, cfg.device, summary_path, cfg.out, progress)
    if device is None:
        return json.loads(summary_path.read_text())
    loaded = load_open_clip(cfg.arch, cfg.init)
    model = loaded.model.to(device)
    tokenizer = ClipTokenizer(int(model.context_length))
    train = load_split(cfg.dataset, cfg.images_root, "train", loaded.preprocess, cfg.max_train_images,
                       cfg.workers, need_long=cfg.captions == "long", progress=progress)
    val = load_split(cfg.dataset, cfg.images_root, "val", loaded.preprocess, cfg.max_val_images, cfg.workers,
                     progress=progress)
    pools = train.pool(cfg.captions)
    steps_per_epoch = math.ceil(len(train.image_ids) / cfg.batch_size)
    optimizer, scheduler = optimizer_and_schedule(model, cfg.lr, cfg.weight_decay, cfg.warmup_steps,
                                                  steps_per_epoch * cfg.epochs)
    generator = torch.Generator().manual_seed(cfg.seed)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    state_path = Path(cfg.out).with_suffix(".state.pt")
    first_epoch = resume(state_path, model, optimizer, scheduler, generator)
    text_forward = clip_text_forward(model)
    log_path = Path(cfg.out).with_suffix(".metrics.jsonl")
    trim_log(log_path, first_epoch)
    metrics: dict = {}
    for epoch in range(first_epoch, cfg.epochs):
        model.train()
        order = torch.randperm(len(train.image_ids), generator=generator).tolist()
        bar = tqdm(range(0, len(order), cfg.batch_size), desc=f"clip epoch {epoch + 1}/{cfg.epochs}",
                   disable=not progress)
        total = 0.0
        for begin in bar:
            rows = order[begin: begin + cfg.batch_size]
            tokens = tokenizer.padded(tokenizer.ids(sample_captions(pools, rows, generator))).to(device)
            image = F.normalize(model.encode_image(train.images[rows].to(device)), dim=-1)
            text = F.normalize(text_forward(tokens), dim=-1)
            loss = info_nce(image, text, model.logit_scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        metrics = {"epoch": epoch + 1, "train_loss": total / steps_per_epoch,
                   **evaluate_retrieval(model, tokenizer, val, device)}
        append_line(log_path, to_json(metrics))
        if progress:
            print(json.dumps(metrics))
        save_state(state_path, model, optimizer, scheduler, generator, epoch + 1)
    save_weights(model, cfg.out)
    summary = {"out": cfg.out, "arch": cfg.arch, "val": metrics, "truncated_captions": tokenizer.truncated}
    write_json(summary_path, {"config": asdict(cfg), **summary}, indent=2)
    state_path.unlink(missing_ok=True)
    return summary


@torch.no_grad()
def evaluate_retrieval(model, tokenizer: ClipTokenizer, val: ImageCaptions, device: torch.device) -> dict:
    """R@1 both ways on val with each image's first short caption and, where present, first long one."""
    model.eval()
    text_forward = clip_text_forward(model)
    image = embed_images(model.encode_image, val.images, device)
    out = {}
    for kind, pools in (("short", val.short), ("long", val.long)):
        if not all(pools):
            continue
        captions = [p[0] for p in pools]
        text = embed_texts(text_forward, tokenizer, captions, device)
        out.update({f"val_{kind}_{k}": v for k, v in recall_at_1(image, text).items()})
    return out


def _validate(cfg: TrainClipConfig) -> None:
    require_keys(cfg, ("dataset", "images_root", "out"), "train_clip")
    if not cfg.out.endswith(".safetensors"):
        raise ConfigError(f"train_clip 'out' must end in .safetensors, got {cfg.out!r}")
    if cfg.epochs < 1 or cfg.batch_size < 2:
        raise ConfigError("train_clip needs epochs >= 1 and batch_size >= 2 (contrastive batches)")
