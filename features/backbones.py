"""Feature backbones: `patches` (no weights) and `open_clip:<arch>` (any open_clip model).

A backbone maps a batch of images to grid tokens `att [B, P, D]`, a pooled vector `fc [B, D']`
and, when it has one, an L2-normalised image embedding for reward caches `embed [B, d]`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision import transforms

from features.clip_models.open_clip_models import load_open_clip
from plumbing.errors import ConfigError


@dataclass
class Encoded:
    att: torch.Tensor | None
    fc: torch.Tensor | None
    embed: torch.Tensor | None = None


class PatchBackbone:
    """A fixed grid of raw pixel patches: att = flattened p×p RGB patches, fc = their mean.

    It needs no weights and keeps every pixel, so a captioner with its own visual stem can
    still learn shapes from it.
    """

    has_embed = False
    has_feats = True

    def __init__(self, image_size: int = 64, patch: int = 8):
        if image_size % patch:
            raise ConfigError(f"image size {image_size} must be a multiple of the patch size {patch}")
        self.image_size, self.patch = image_size, patch
        self.name = "patches"
        self.fingerprint = hashlib.sha256(f"patches-v1-{image_size}-{patch}".encode()).hexdigest()[:16]
        self.transform: Callable = transforms.Compose([
            transforms.Resize((image_size, image_size), interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.ToTensor(),
        ])
        grid = image_size // patch
        self.att_shape = (grid * grid, 3 * patch * patch)
        self.fc_dim = 3 * patch * patch

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> Encoded:
        p = self.patch
        patches = F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)  # [B, P, 3p²]
        return Encoded(att=patches, fc=patches.mean(dim=1))


class OpenClipBackbone:
    """Grid tokens of the image tower's last block, its pooled output and the normalised embedding."""

    has_embed = True
    has_feats = True

    def __init__(self, arch: str, pretrained: str | None, device: str | torch.device = "cpu"):
        loaded = load_open_clip(arch, pretrained, device)
        self.model, self.transform = loaded.model, loaded.preprocess
        self.name = f"open_clip:{arch}"
        self.fingerprint = loaded.fingerprint
        self.source = loaded.source
        self.device = torch.device(device)
        size = self.model.visual.image_size
        self.image_size = size[0] if isinstance(size, (tuple, list)) else int(size)
        probe = self.encode(torch.zeros(1, 3, self.image_size, self.image_size, device=self.device))
        self.att_shape = tuple(probe.att.shape[1:])
        self.fc_dim = probe.fc.shape[1]
        self.embed_dim = probe.embed.shape[1]

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> Encoded:
        out = self.model.forward_intermediates(
            image=images.to(self.device), image_indices=1, normalize=False,
            normalize_intermediates=True, image_output_fmt="NCHW",
        )
        grid = out["image_intermediates"][-1]  # [B, C, H, W], prefix tokens excluded
        pooled = out["image_features"]
        return Encoded(att=grid.flatten(2).transpose(1, 2), fc=pooled, embed=F.normalize(pooled, dim=-1))


class RewardModelBackbone:
    """Image embeddings only, from a LongCLIP/SPECS or L-CLIP reward model (no grid features)."""

    has_embed = True
    has_feats = False

    def __init__(self, kind: str, pretrained: str | None, device: str | torch.device = "cpu"):
        from features.clip_models.factory import RewardModelSpec, load_reward_model

        self.model = load_reward_model(RewardModelSpec(kind=kind, weights=pretrained), device)
        self.name, self.fingerprint, self.transform = kind, self.model.fingerprint, self.model.preprocess
        self.device = torch.device(device)
        self.image_size = _side(self.transform)
        self.embed_dim = self.encode(torch.zeros(1, 3, self.image_size, self.image_size)).embed.shape[1]

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> Encoded:
        embed = F.normalize(self.model.encode_image(images.to(self.device)).float(), dim=-1)
        return Encoded(att=None, fc=None, embed=embed)


def _side(transform: Callable) -> int:
    for step in getattr(transform, "transforms", []):
        if isinstance(step, transforms.CenterCrop):
            return int(step.size[0])
    raise ConfigError("cannot read the image size from the reward model's transform")


REWARD_KINDS = ("longclip", "lclip")
Backbone = PatchBackbone | OpenClipBackbone | RewardModelBackbone


def make_backbone(spec: str, pretrained: str | None = None, image_size: int = 64, patch: int = 8,
                  device: str | torch.device = "cpu") -> Backbone:
    if spec == "patches":
        return PatchBackbone(image_size, patch)
    if spec.startswith("open_clip:"):
        return OpenClipBackbone(spec.split(":", 1)[1], pretrained, device)
    if spec in REWARD_KINDS:
        return RewardModelBackbone(spec, pretrained, device)
    raise ConfigError(f"unknown backbone {spec!r}; use 'patches', 'open_clip:<arch>' (e.g. open_clip:ViT-B-32), "
                      f"or a reward model for embeddings only: {', '.join(REWARD_KINDS)}")
