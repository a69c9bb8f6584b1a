"""Pieces the reward-model recipes share besides their loop (rewards.recipes.loop): CLIP's
no-decay parameter groups, trimming a resumed run's log, and atomic weight files."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from plumbing.atomic import atomic_path, write_text


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No decay on gains, biases, embeddings and the temperature (as CLIP training does)."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if param.ndim >= 2 and "embedding" not in name else plain).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def trim_log(path: Path, epochs_done: int, stage: str | None = None) -> None:
    """A resumed run redoes the epochs after its state: drop their lines (a crash between a log
    append and the state save would otherwise log one epoch twice). With `stage`, only that
    stage's lines are trimmed."""
    if not path.exists():
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    kept = [line for line, r in zip(lines, records, strict=True)
            if (stage is not None and r.get("stage") != stage) or r.get("epoch", 0) <= epochs_done]
    if len(kept) != len(lines):
        write_text(path, "".join(line + "\n" for line in kept))


def save_weights(model: torch.nn.Module, out: str | Path, state: dict | None = None) -> None:
    """safetensors, written to a temporary name and renamed; `state` overrides the model's dict."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in (state or model.state_dict()).items()}
    with atomic_path(out) as tmp:
        save_file(state, str(tmp))


def save_pt(state: dict, out: str | Path) -> None:
    """A torch file of tensors (loadable with weights_only=True), written atomically."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        torch.save(state, tmp)
