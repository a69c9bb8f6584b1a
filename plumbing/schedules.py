"""The learning-rate schedule every trainer uses (captioner and reward models): linear warmup,
then cosine, linear, constant or noam (the Transformer's inverse square root of the step, as the
reference SCST codebase's NoamOpt: its peak, factor·d_model^-0.5·warmup^-0.5, is the config's rate),
never below `min_ratio` of the peak."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

Schedule = Literal["cosine", "linear", "constant", "noam"]


def lr_factor(warmup: int, total: int, schedule: Schedule = "cosine", min_ratio: float = 0.0) -> Callable[[int], float]:
    """Multiplier of the peak rate at optimizer step `step` (for torch's LambdaLR)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        if schedule == "noam":
            return max(min_ratio, math.sqrt(max(1, warmup) / (step + 1)))
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return min_ratio + (1 - min_ratio) * (1 - progress)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
