"""Pieces every reward-model training command shares: optimiser groups, the warmup-cosine
schedule, epoch-level resume state and atomic safetensors weights."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from captioner.atomic import atomic_path


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No decay on gains, biases, embeddings and the temperature (as CLIP training does)."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if param.ndim >= 2 and "embedding" not in name else plain).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def cosine_schedule(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def save_state(path: Path, model, optimizer, scheduler, generator: torch.Generator, epoch: int) -> None:
    with atomic_path(path) as tmp:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
                    "epoch": epoch}, tmp)


def resume(path: Path, model, optimizer, scheduler, generator: torch.Generator) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    print(f"resuming {path} after epoch {state['epoch']}")
    return int(state["epoch"])


def save_weights(model: torch.nn.Module, out: str | Path, state: dict | None = None) -> None:
    """safetensors, written to a temporary name and renamed; `state` overrides the model's dict."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in (state or model.state_dict()).items()}
    with atomic_path(out) as tmp:
        save_file(state, str(tmp))
