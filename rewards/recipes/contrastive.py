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


CHUNK = 256  # rows per forward when embedding a whole split


@torch.no_grad()
def embed_images(encode, images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Normalised embeddings of a split's images, in chunks."""
    return torch.cat([F.normalize(encode(images[i: i + CHUNK].to(device)).float(), dim=-1)
                      for i in range(0, len(images), CHUNK)])


@torch.no_grad()
def embed_texts(encode, tokenizer, texts: list[str], device: torch.device) -> torch.Tensor:
    """Normalised embeddings of texts, in chunks trimmed to their longest sequence."""
    return torch.cat([F.normalize(encode(tokenizer.padded(tokenizer.ids(texts[i: i + CHUNK])).to(device)).float(),
                                  dim=-1) for i in range(0, len(texts), CHUNK)])
