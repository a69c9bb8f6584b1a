"""`python -m rewards.train_clip --config configs/reward_models/world_clip.yaml`

Contrastive training of an open_clip architecture (by default `world-clip-tiny`, registered from
rewards/model_configs) on a Karpathy-format dataset's images with their short and long captions.
It writes an open_clip state dict (safetensors) that loads through the same path as any user
checkpoint (`load_open_clip(arch, path)`), and reports image→text / text→image R@1 on val
against chance. Interrupted runs resume from the last finished epoch.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from captioner.atomic import append_line, write_json
from captioner.cli import add_config_args, command, config_from_args
from captioner.config import require_keys
from captioner.device import pick_device
from captioner.errors import ConfigError
from rewards.clip_tokens import ClipTokenizer
from rewards.contrastive import embed_images, embed_texts, info_nce, recall_at_1
from rewards.open_clip_models import load_open_clip
from rewards.reward_models import clip_text_forward
from rewards.train_utils import (
    cosine_schedule,
    param_groups,
    resume,
    save_state,
    save_weights,
)
from rewards.training_data import (
    CaptionKind,
    ImageCaptions,
    load_split,
    sample_captions,
)

MAX_LOGIT_SCALE = math.log(100.0)


@dataclass
class TrainClipConfig:
    arch: str = "world-clip-tiny"
    init: str | None = None  # starting weights (file or hub tag); None = random init
    dataset: str = ""
    images_root: str = ""
    out: str = ""  # the checkpoint (.safetensors)
    captions: CaptionKind = "both"
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 50
    max_train_images: int = 0  # 0 = the whole train split
    max_val_images: int = 500
    seed: int = 0
    device: str = "auto"
    workers: int = 2


def train_clip(cfg: TrainClipConfig, progress: bool = True) -> dict:
    _validate(cfg)
    summary_path = Path(cfg.out).with_suffix(".json")
    if Path(cfg.out).exists() and summary_path.exists():
        if progress:
            print(f"{cfg.out} is already trained ({summary_path}); nothing to do")
        return json.loads(summary_path.read_text())
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    loaded = load_open_clip(cfg.arch, cfg.init)
    model = loaded.model.to(device)
    tokenizer = ClipTokenizer(int(model.context_length))
    train = load_split(cfg.dataset, cfg.images_root, "train", loaded.preprocess, cfg.max_train_images,
                       cfg.workers, need_long=cfg.captions == "long", progress=progress)
    val = load_split(cfg.dataset, cfg.images_root, "val", loaded.preprocess, cfg.max_val_images, cfg.workers,
                     progress=progress)
    pools = train.pool(cfg.captions)
    steps_per_epoch = math.ceil(len(train.image_ids) / cfg.batch_size)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_schedule(cfg.warmup_steps, steps_per_epoch * cfg.epochs))
    generator = torch.Generator().manual_seed(cfg.seed)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    state_path = Path(cfg.out).with_suffix(".state.pt")
    start = resume(state_path, model, optimizer, scheduler, generator)
    text_forward = clip_text_forward(model)
    log_path = Path(cfg.out).with_suffix(".metrics.jsonl")
    metrics: dict = {}
    for epoch in range(start, cfg.epochs):
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
        append_line(log_path, json.dumps(metrics))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rewards.train_clip",
        description="Train a CLIP (any open_clip architecture) contrastively on a Karpathy-format dataset; "
        "prints val R@1 (image->text, text->image) against chance each epoch. Resumes after an interruption.",
    )
    parser.add_argument("--dataset", help="Karpathy-format dataset.json")
    parser.add_argument("--images-root", help="folder the dataset's image paths are relative to")
    parser.add_argument("--out", help="output weights (.safetensors)")
    parser.add_argument("--arch", help="open_clip architecture (default world-clip-tiny)")
    parser.add_argument("--epochs", type=int, help="training epochs")
    parser.add_argument("--device", help="auto (GPU when present), cpu or cuda")
    add_config_args(parser)
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags = {k: getattr(args, k) for k in ("dataset", "images_root", "out", "arch", "epochs", "device")}
    summary = train_clip(config_from_args(TrainClipConfig, args, flags))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
