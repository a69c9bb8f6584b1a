"""Pieces the reward-model recipes share besides their loop (rewards.recipes.loop): locking a tower,
CLIP's no-decay parameter groups, trimming a resumed run's log, atomic weight files, and the check that
a finished output was trained with the settings and from the starting model asked for."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from types import MethodType

import torch

from plumbing.atomic import atomic_path, to_json, write_text
from plumbing.config import field_default
from plumbing.errors import ConfigError
from plumbing.jsonl import read_jsonl

# Settings that do not change the weights: a finished output stays valid when only these differ.
RUNTIME_KEYS = frozenset({"workers", "image_cache_mb", "device", "max_val_images", "eval_every", "allow_outside_root"})


def finished_summary(cfg, out: str | Path, progress: bool = True) -> dict | None:
    """The summary of a finished run of this recipe at `out` (None when there is none yet).

    A run is finished when its output and its summary (`<out>.json`, written last, with the
    resolved config) both exist. If that config differs from `cfg` in a setting that shapes the
    weights, skipping would hand back a model the user did not ask for: that is an error. A setting
    the summary lacks was added after the run, and options are added off by default, so the run
    had its default: asking for another value is a change too."""
    out = Path(out)
    summary_path = out.with_suffix(".json")
    if not (out.exists() and summary_path.exists()):
        return None
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    _refuse_if_started_elsewhere(cfg, out, summary)
    saved = {**_field_defaults(cfg), **_settings(cfg, summary.get("config", {}))}
    wanted = _settings(cfg, json.loads(json.dumps(asdict(cfg))))
    changed = [f"{key}: {saved[key]!r} -> {value!r}" for key, value in wanted.items()
               if key not in RUNTIME_KEYS and key in saved and saved[key] != value]
    if changed:
        raise ConfigError(f"{out} was trained with other settings ({'; '.join(changed)}); delete {out} and "
                          f"{summary_path.name} to retrain it, or choose another `out`")
    if progress:
        print(f"{out} is already trained ({summary_path}); nothing to do")
    return {**summary, "skipped": True}


# Settings that name the model a recipe starts from (SPECS's `init`, the student's `teacher`).
START_KEYS = ("init", "teacher")


def summary_record(cfg, summary: dict) -> dict:
    """What a recipe writes to `<out>.json` when it finishes: its resolved settings, the sha256 of
    each starting model's file (so a later start is noticed) and its results."""
    return {"config": asdict(cfg), "starts": _start_digests(cfg), **summary}


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _start_digests(cfg) -> dict[str, str]:
    starts = {key: getattr(cfg, key, None) for key in START_KEYS}
    return {key: file_sha256(path) for key, path in starts.items() if path and Path(path).is_file()}


def _refuse_if_started_elsewhere(cfg, out: Path, summary: dict) -> None:
    """A starting file that changed since the output was finished (a world CLIP retrained with new
    settings) would leave the output built from the old one under the same settings. Summaries
    written before the digests were recorded are not checked."""
    recorded = summary.get("starts")
    if not recorded:
        return
    now = _start_digests(cfg)  # read only when there is a record to compare with
    for key, digest in recorded.items():
        if key in now and now[key] != digest:
            raise ConfigError(f"{out} was trained from another {key} than {getattr(cfg, key)} holds now "
                              f"(sha256 {digest[:12]}... then, {now[key][:12]}... now); delete {out} and "
                              f"{out.with_suffix('.json').name} to retrain it from this one")


def _field_defaults(cfg) -> dict:
    """Each setting's default, as a summary writes settings (JSON values), sections' settings by their own names."""
    defaults = {f.name: field_default(f) for f in fields(cfg)}
    plain = {name: asdict(value) if is_dataclass(value) else value for name, value in defaults.items()}
    return _settings(cfg, json.loads(json.dumps(plain)))


def _settings(cfg, config: dict) -> dict:
    """A recipe's settings with its sections' (train_clip's `world`) lifted to the top: a summary written
    before a setting moved into a section still compares with the settings of today."""
    sections = {f.name for f in fields(cfg) if is_dataclass(getattr(cfg, f.name))}
    flat = {}
    for key, value in config.items():
        if key in sections and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat


def lock(tower: torch.nn.Module) -> None:
    """No gradients, and eval mode held whoever calls `train()` (a loop's `model.train()`, a helper
    restoring the mode it found): batch norms read their running statistics and keep them, so the
    tower comes out of training exactly as it went in, and what trains beside it sees the embeddings
    a scorer computes."""
    tower.requires_grad_(False)
    tower.train = MethodType(_held_in_eval, tower)  # an instance attribute: Module.train calls it on children
    tower.eval()


def unlock(tower: torch.nn.Module) -> None:
    """Undo `lock`: the tower trains again (in training mode from the next `train()` call)."""
    tower.requires_grad_(True)
    tower.__dict__.pop("train", None)


def _held_in_eval(tower: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
    return torch.nn.Module.train(tower, False)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No decay on gains, biases, embeddings and the temperature (as CLIP training does)."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:  # a locked tower (train_clip's lock_image_tower)
            continue
        (decay if param.ndim >= 2 and "embedding" not in name else plain).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def trim_log(path: Path, epochs_done: int, stage: str | None = None) -> None:
    """A resumed run redoes the epochs after its state: drop their lines (a crash between a log
    append and the state save would otherwise log one epoch twice). With `stage`, only that
    stage's lines are trimmed."""
    if not path.exists():
        return
    records = read_jsonl(path)
    kept = [r for r in records
            if (stage is not None and r.get("stage") != stage) or r.get("epoch", 0) <= epochs_done]
    if len(kept) != len(records):  # a cut-short last line goes at the next append (`append_line`)
        write_text(path, "".join(to_json(r) + "\n" for r in kept))


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
