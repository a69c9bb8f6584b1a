"""Per-reward normalisation before mixing, so rewards of different scales (CIDEr-D about 1-4,
CLIP-S about 0.5-2.5) mix by their weights, not by their ranges.

- `batch_z`: each reward is centred and scaled by its mean and std over the batch;
- `running_z`: by an exponential moving average of mean and variance over the batches so far
  (the batch is included first, so the first batch is scaled like `batch_z`).

Under several processes the statistics are those of the global batch (summed across processes),
so one process and N processes with the same global batch normalise alike. The running state is
small and saved with the trainer's state, so a resumed run normalises exactly as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.distributed as dist

Normalize = Literal["none", "batch_z", "running_z"]
EPS = 1e-6


@dataclass
class Moments:
    mean: float = 0.0
    var: float = 1.0
    batches: int = 0


def global_moments(values: torch.Tensor) -> tuple[float, float]:
    """Mean and (population) variance over every process's values."""
    stats = torch.tensor([values.sum().item(), (values * values).sum().item(), float(values.numel())],
                         dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stats)
    total, squares, count = stats.tolist()
    mean = total / max(count, 1.0)
    return mean, max(squares / max(count, 1.0) - mean * mean, 0.0)


class RewardNormalizer:
    def __init__(self, mode: Normalize = "none", decay: float = 0.99):
        self.mode, self.decay = mode, decay
        self.moments: dict[str, Moments] = {}
        self.last: dict[str, tuple[float, float]] = {}  # the (mean, var) each reward was last scaled by

    def __call__(self, name: str, values: torch.Tensor, fit: bool = True) -> torch.Tensor:
        """Normalised values; `fit=False` reuses the last statistics (e.g. the greedy baseline's
        captions are scaled like the samples they are compared with)."""
        if self.mode == "none":
            return values
        if fit or name not in self.last:
            self.last[name] = self._fit(name, values)
        mean, var = self.last[name]
        return (values - mean) / (var ** 0.5 + EPS)

    def _fit(self, name: str, values: torch.Tensor) -> tuple[float, float]:
        mean, var = global_moments(values)
        if self.mode == "running_z":
            state = self.moments.setdefault(name, Moments(mean, var, 0))
            if state.batches:
                state.mean = self.decay * state.mean + (1 - self.decay) * mean
                state.var = self.decay * state.var + (1 - self.decay) * var
            state.batches += 1
            mean, var = state.mean, state.var
        return mean, var

    def state_dict(self) -> dict:
        return {name: asdict(m) for name, m in self.moments.items()}

    def load_state_dict(self, state: dict) -> None:
        self.moments = {name: Moments(**m) for name, m in state.items()}
