"""The optimizer every trainer uses (captioner and reward models)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def adamw(params: Iterable[Any], **kwargs: Any) -> torch.optim.AdamW:
    """torch's AdamW with its fused kernel: the same update rule, applied to every parameter in one
    pass instead of a loop of small ops per tensor. On the 2-core CPU the world CLIP's update (8 M
    parameters, most of them the token embedding) falls from about 0.10 s a step to 0.02 s."""
    return torch.optim.AdamW(params, fused=True, **kwargs)
