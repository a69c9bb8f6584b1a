"""Contrastive objectives and retrieval recall for dual encoders."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric CLIP loss on normalised embeddings; row i of each is a matching pair."""
    logits = logit_scale.exp() * image @ text.t()
    target = torch.arange(len(image), device=image.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def recall_at_1(image: torch.Tensor, text: torch.Tensor) -> dict[str, float]:
    """Image→text and text→image R@1 for N matching pairs (chance = 1/N)."""
    similarity = image @ text.t()
    target = torch.arange(len(image), device=image.device)
    return {
        "i2t_r1": float((similarity.argmax(1) == target).float().mean()),
        "t2i_r1": float((similarity.argmax(0) == target).float().mean()),
        "chance": 1.0 / len(image),
    }
