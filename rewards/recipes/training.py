"""What every reward-model training recipe shares: the prologue (skip a finished run, seed, pick
the device), AdamW with CLIP's no-decay groups under the captioner's learning-rate schedule,
epoch-level resume state and atomic weight files."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from plumbing.atomic import atomic_path, write_text
from plumbing.device import pick_device
from plumbing.schedules import Schedule, lr_factor


def start(seed: int, device: str, done: Path, what: str, progress: bool) -> torch.device | None:
    """None when `done` (written last, atomically) says the run finished; else seed and the device."""
    if done.exists():
        if progress:
            print(f"{what} is already trained ({done}); nothing to do")
        return None
    torch.manual_seed(seed)
    return pick_device(device)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No decay on gains, biases, embeddings and the temperature (as CLIP training does)."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if param.ndim >= 2 and "embedding" not in name else plain).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def optimizer_and_schedule(model: torch.nn.Module, lr: float, weight_decay: float, warmup: int, total_steps: int,
                           schedule: Schedule = "cosine") -> tuple[torch.optim.Optimizer, LambdaLR]:
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)
    scheduler = LambdaLR(optimizer, lr_factor(warmup, total_steps, schedule))
    return optimizer, scheduler


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


def trim_log(path: Path, epochs_done: int, key: str = "epoch") -> None:
    """A resumed run redoes the epochs after its state: drop their lines (a crash between a log
    append and the state save would otherwise log one epoch twice)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get(key, 0) <= epochs_done]
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
