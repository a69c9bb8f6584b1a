"""open_clip models by architecture name, with weights from a local file or a hub name."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import open_clip
import torch

from features.clip_models.checkpoints import fingerprint, load_into, load_state_dict_file
from plumbing.errors import ConfigError, DataError

# rlcap's own architectures (the world CLIP) join open_clip's registry, so they load by name
# through the same path as any open_clip model.
MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")
if not {p.stem for p in MODEL_CONFIG_DIR.glob("*.json")} <= set(open_clip.list_models()):
    open_clip.add_model_config(MODEL_CONFIG_DIR)


@dataclass
class LoadedClip:
    model: Any  # open_clip.CLIP or CustomTextCLIP
    preprocess: Any  # PIL image -> tensor, the model's eval transform
    arch: str
    source: str  # the weights file, hub tag, or "random-init"
    fingerprint: str


def load_open_clip(arch: str, pretrained: str | None = None, device: str | torch.device = "cpu") -> LoadedClip:
    """Build `arch`; load weights from a local file (safely) or a hub tag; None = random init.

    A hub tag needs the network; a local file never does.
    """
    if arch not in open_clip.list_models():
        raise ConfigError(f"unknown open_clip architecture {arch!r}; e.g. {', '.join(open_clip.list_models()[:6])}")
    is_file = pretrained is not None and Path(pretrained).exists()
    hub = pretrained if pretrained and not is_file else None
    if hub and ("/" in hub or Path(hub).suffix in (".pt", ".pth", ".bin", ".ckpt", ".safetensors")):
        raise DataError(f"{hub}: weights file not found")
    if hub and hub not in open_clip.list_pretrained_tags_by_model(arch):
        raise ConfigError(
            f"pretrained {pretrained!r} is neither an existing file nor an open_clip tag for {arch} "
            f"(tags: {', '.join(open_clip.list_pretrained_tags_by_model(arch)) or 'none'})"
        )
    try:
        with _quiet_root_logger():  # open_clip warns "initialized randomly" before we load the file
            model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=hub, device="cpu")
    except (RuntimeError, OSError) as exc:
        if not hub:
            raise
        raise DataError(f"cannot fetch the open_clip weights {arch} {hub!r} (no network, and not in the local hub "
                        f"cache): {str(exc).splitlines()[0][:200]}; give a weights file instead (--pretrained PATH)"
                        ) from None
    if is_file:
        load_into(model, load_state_dict_file(pretrained), pretrained)
    model = model.to(device).eval()
    source = str(pretrained) if pretrained else "random-init"
    return LoadedClip(model, preprocess, arch, source, fingerprint(model))


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)  # a failed download logs an ERROR before raising what we report
    try:
        yield
    finally:
        root.setLevel(level)
