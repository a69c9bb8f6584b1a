"""Tiny reward models saved in their real file layouts, and embeds files written by features.extract."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from features.clip_models.lclip import LClip, LClipConfig
from features.clip_models.longclip import stretch_state_dict
from features.clip_models.open_clip_models import load_open_clip
from features.extract import ExtractConfig, extract

TINY_ARCH = "world-clip-tiny"
TINY_LCLIP = LClipConfig(embed_dim=32, image_size=32, patch_size=8, vision_width=128, vision_layers=4, vision_heads=2,
                         context_length=77, embed_rank=16, text_width=128, text_layers=4, text_heads=2)


def clip_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.contiguous() for k, v in load_open_clip(TINY_ARCH).model.state_dict().items()}


def save_open_clip(path: Path, seed: int = 0) -> Path:
    save_file(clip_state(seed), str(path))
    return path


def save_longclip(path: Path, seed: int = 1) -> Path:
    """A SPECS-style spec.pt: OpenAI-CLIP key names + positional_embedding_res (differing after row 20)."""
    state = stretch_state_dict(clip_state(seed))
    state["positional_embedding_res"] = state["positional_embedding_res"] + 0.05 * torch.randn_like(
        state["positional_embedding_res"])
    torch.save(state, path)
    return path


def save_lclip(path: Path, seed: int = 2) -> tuple[Path, LClip]:
    """A DistillCLIP Lightning checkpoint: student under `student.`, teacher under `teacher.`."""
    torch.manual_seed(seed)
    model = LClip(TINY_LCLIP).eval()
    state = {f"student.{k}": v for k, v in model.state_dict().items()}
    state["teacher.visual.proj"] = torch.randn(8, 8)
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.1.0", "state_dict": state,
                "optimizer_states": [], "lr_schedulers": []}, path)
    return path, model


def write_embeds(world: Path, backbone: str, weights: Path, out: Path) -> Path:
    extract(ExtractConfig(dataset=str(world / "dataset.json"), images_root=str(world), backbone=backbone,
                          pretrained=str(weights), embeds_out=str(out), workers=0, batch_size=32), progress=False)
    return out
