"""Training the grammar model: a copy of a CLIP's text tower, fine-tuned with a head on its embedding to
tell clean captions from corrupted ones (the `clip` reward model the `grammar` reward reads).

Each epoch every train caption meets one corrupted copy of itself (a word repeated, removed or inserted,
two neighbours swapped, the words shuffled: rewards/text/corrupt.py). Held-out accuracy is measured on
the val split's captions and their corruptions (drawn once, seeded), overall and per corruption. The
CLIP's own file is not touched: CLIP-S reads the tower it had.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from features.clip_models.factory import load_reward_model
from features.clip_models.spec import RewardModelSpec
from plumbing.atomic import write_json
from plumbing.config import option, require_keys, to_dict
from plumbing.device import pick_device
from plumbing.errors import ConfigError, DataError
from plumbing.karpathy import load_dataset
from rewards.clip.grammar import GrammarModel, save_model
from rewards.text.corrupt import CORRUPTIONS, corrupt


@dataclass
class GrammarConfig:
    dataset: str = option("", help="Karpathy-format dataset.json: the train split's captions are the clean ones")
    kind: str = option("open_clip", help="reward-model kind of --weights: open_clip, longclip or lclip")
    arch: str = option("ViT-B-32", help="open_clip architecture of --weights")
    weights: str | None = option(None, help="the CLIP whose text embeddings the head reads: a file or a hub tag")
    out: str = option("", help="the head to write (.safetensors); name it as reward_models.clip.grammar")
    epochs: int = option(6, help="passes over the train captions, each with fresh corruptions", at_least=1)
    batch_size: int = option(256, help="texts per step, clean and corrupted mixed", at_least=2)
    lr: float = option(1e-3, help="the head's AdamW learning rate", above=0)
    tower_lr: float = option(3e-4, help="the text tower's AdamW learning rate (its copy is fine-tuned)", above=0)
    hidden: int = option(256, help="the head's hidden width", at_least=1)
    corruptions: list[str] = option(factory=lambda: list(CORRUPTIONS), help="the corruptions a negative may get")
    max_captions: int = option(0, help="use at most this many train captions (0 = all)", at_least=0)
    seed: int = option(0, help="random seed")
    device: str = option("auto", help="auto (the GPU when present) or cpu")


@dataclass
class Examples:
    clean: list[str]
    vocabulary: list[str]
    val: list[tuple[str, str, int]] = field(default_factory=list)  # (kind or "clean", text, label)


def captions_of(cfg: GrammarConfig) -> Examples:
    entries = load_dataset(cfg.dataset)
    train = [c for e in entries if e.split == "train" for c in e.raw_captions if c.strip()]
    val = [c for e in entries if e.split == "val" for c in e.raw_captions[:1] if c.strip()]
    if not train or not val:
        raise DataError(f"{cfg.dataset}: the grammar head needs train captions and val captions (a val split) "
                        f"to measure it; found {len(train)} and {len(val)}")
    rng = random.Random(cfg.seed)
    if cfg.max_captions:
        train = rng.sample(train, min(cfg.max_captions, len(train)))
    vocabulary = sorted({w for c in train for w in c.split()})
    held_out = [("clean", c, 1) for c in val]
    for caption in val:
        if (edit := corrupt(caption, rng, vocabulary, cfg.corruptions)) is not None:
            held_out.append((edit[0], edit[1], 0))
    return Examples(train, vocabulary, held_out)


def train_grammar(cfg: GrammarConfig, progress: bool = True) -> dict:
    require_keys(cfg, ("dataset", "out"), "train_grammar")
    if unknown := sorted(set(cfg.corruptions) - set(CORRUPTIONS)):
        raise ConfigError(f"corruptions: unknown {unknown}; known: {', '.join(CORRUPTIONS)}")
    if not cfg.out.endswith(".safetensors"):
        raise ConfigError(f"train_grammar 'out' must end in .safetensors, got {cfg.out!r}")
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    reward_model = load_reward_model(RewardModelSpec(kind=cfg.kind, arch=cfg.arch, weights=cfg.weights), device,
                                     fresh=True)
    start_fingerprint = reward_model.fingerprint  # of the CLIP as it starts: the one the reward will name
    model = GrammarModel(reward_model, cfg.hidden).to(device)
    text_params = [p for name, p in model.tower.named_parameters() if not name.startswith("visual.")]
    optimizer = torch.optim.AdamW([{"params": text_params, "lr": cfg.tower_lr},
                                   {"params": model.head.parameters(), "lr": cfg.lr}], weight_decay=0.01)
    data = captions_of(cfg)
    rng, generator = random.Random(cfg.seed + 1), torch.Generator().manual_seed(cfg.seed)
    log = []
    for epoch in range(cfg.epochs):
        pairs = [(c, corrupt(c, rng, data.vocabulary, cfg.corruptions)) for c in data.clean]
        texts = [c for c, edit in pairs if edit] + [edit[1] for _, edit in pairs if edit]
        labels = torch.tensor([1.0] * (len(texts) // 2) + [0.0] * (len(texts) // 2), device=device)
        loss = fit_epoch(model, optimizer, texts, labels, cfg.batch_size, generator)
        log.append({"epoch": epoch, "loss": loss, **evaluate(model, data.val, cfg.batch_size)})
        if progress:
            print(json.dumps(log[-1]), flush=True)
    save_model(model, cfg.out, start_fingerprint, cfg.arch)
    summary = {"out": cfg.out, "clip": cfg.weights, "clip_fingerprint": start_fingerprint,
               "train_captions": len(data.clean), "val": log[-1], "epochs": log, "config": to_dict(cfg),
               "val_items": dict(Counter(kind for kind, _, _ in data.val))}
    write_json(Path(cfg.out).with_suffix(".json"), summary, indent=2)
    return summary


def fit_epoch(model: GrammarModel, optimizer: torch.optim.Optimizer, texts: list[str], labels: torch.Tensor,
              batch_size: int, generator: torch.Generator) -> float:
    model.train()
    order = torch.randperm(len(texts), generator=generator).tolist()
    total = 0.0
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        loss = F.binary_cross_entropy_with_logits(model.logits([texts[i] for i in rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(rows)
    return total / len(order)


@torch.no_grad()
def evaluate(model: GrammarModel, held_out: list[tuple[str, str, int]], batch_size: int) -> dict:
    """Held-out accuracy: all items, the clean ones, and each corruption's."""
    model.eval()
    texts = [text for _, text, _ in held_out]
    logits = torch.cat([model.logits(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)])
    right = ((logits > 0).long().cpu() == torch.tensor([label for _, _, label in held_out])).tolist()
    out = {"val_accuracy": sum(right) / len(right)}
    for kind in dict.fromkeys(k for k, _, _ in held_out):
        mine = [r for (k, _, _), r in zip(held_out, right, strict=True) if k == kind]
        out[f"val_{kind}"] = sum(mine) / len(mine)
    return out
