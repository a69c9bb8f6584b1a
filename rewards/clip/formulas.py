"""The CLIP-family formulas on normalised embeddings (docs/ARCHITECTURE.md, "Metric names").

Pure functions, so each one can be tested against its paper's formula directly.
"""

from __future__ import annotations

import torch

CLIP_S_WEIGHT = 2.5  # Hessel et al.: stretches CLIP cosines (mostly 0..0.4) to about 0..1
CLIP_S_PREFIX = "A photo depicts "


def cosine_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of already-normalised [n, d] embeddings."""
    return (a * b).sum(-1)


def clip_s(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    return CLIP_S_WEIGHT * cosine_rows(image, text).clamp(min=0)


def harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """2ab/(a+b), defined as 0 where both are 0 (the reference code would give NaN there)."""
    total = a + b
    return torch.where(total > 0, 2 * a * b / total.clamp(min=1e-12), torch.zeros_like(total))


def ref_clip_s(image: torch.Tensor, text: torch.Tensor, refs: list[torch.Tensor]) -> torch.Tensor:
    """HM(clip_s, max(max_r cos(caption, r), 0)); refs[i] is [R_i, d] for caption i."""
    best = torch.stack([(r @ t).max() if len(r) else t.new_zeros(()) for t, r in zip(text, refs, strict=True)])
    return harmonic_mean(clip_s(image, text), best.clamp(min=0))


def specs(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """(cos + 1) / 2, clamped at 0 as the released SPECS code does."""
    return ((cosine_rows(image, text) + 1.0) / 2.0).clamp(min=0)


def f_clip_s(image: torch.Tensor, text: torch.Tensor, nouns: list[torch.Tensor]) -> torch.Tensor:
    """(s(I, C) + Σ_i s(I, n_i)) / (N + 1), s = 2.5·max(cos, 0); nouns[i] is [N_i, d]."""
    sentence = clip_s(image, text)
    noun_sums = torch.stack([
        (CLIP_S_WEIGHT * (n @ img).clamp(min=0)).sum() if len(n) else img.new_zeros(())
        for img, n in zip(image, nouns, strict=True)
    ])
    counts = torch.tensor([len(n) for n in nouns], dtype=sentence.dtype, device=sentence.device)
    return (sentence + noun_sums) / (counts + 1)
