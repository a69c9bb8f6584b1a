"""The reward bank: named sentence-level rewards, mixed by weight, each timed and logged.

A reward is any object with a `name` that maps a batch of captions (with their image ids) to one
value per caption. Rewards register by name; a config picks them with weights, e.g.
`rewards: {cider_d: 0.3, l_clip_s: 0.7}`. New families (the CLIP-family scores) register here
and need no change to the SCST code.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from plumbing.errors import ConfigError, RlcapError
from rewards.context import ScoringContext
from rewards.normalize import Normalize, RewardNormalizer


class Reward(Protocol):
    name: str

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor: ...


_FACTORIES: dict[str, Callable[[ScoringContext], Reward]] = {}


def register_reward(name: str, factory: Callable[[ScoringContext], Reward]) -> None:
    _FACTORIES[name] = factory


def available_rewards() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def make_reward(name: str, context: ScoringContext) -> Reward:
    _load_builtin()
    if name not in _FACTORIES:
        raise ConfigError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(_FACTORIES))}")
    return _FACTORIES[name](context)


@dataclass
class RewardOutput:
    total: torch.Tensor  # [B] weighted sum of the normalised values
    values: dict[str, torch.Tensor]  # name -> [B], raw
    seconds: dict[str, float]
    normalized: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B], as mixed


class RewardBank:
    def __init__(self, rewards: Mapping[str, Reward], weights: Mapping[str, float], normalize: Normalize = "none"):
        self.rewards, self.weights = dict(rewards), dict(weights)
        self.normalizer = RewardNormalizer(normalize)

    @classmethod
    def from_config(cls, weights: Mapping[str, float], context: ScoringContext | None = None,
                    normalize: Normalize = "none") -> RewardBank:
        context = context if context is not None else ScoringContext()
        if not weights:
            raise ConfigError("rewards: at least one reward with a weight is needed, e.g. {cider_d: 1.0}")
        for name, weight in weights.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight):
                raise ConfigError(f"reward {name!r}: weight must be a finite number, got {weight!r}")
        if all(w == 0 for w in weights.values()):
            raise ConfigError(f"rewards: all weights are zero ({dict(weights)}); nothing to optimise")
        for name, weight in weights.items():
            if weight < 0:
                warnings.warn(f"reward {name!r} has a negative weight ({weight}): it will be minimised", stacklevel=2)
        rewards = {name: make_reward(name, context) for name, weight in weights.items() if weight != 0}
        return cls(rewards, {n: float(w) for n, w in weights.items() if w != 0}, normalize)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int], fit: bool = True) -> RewardOutput:
        """Every reward of the batch; `fit=False` normalises with the last batch's statistics."""
        values, normalized, seconds = {}, {}, {}
        total = torch.zeros(len(captions), dtype=torch.float64)
        for name, reward in self.rewards.items():
            start = time.perf_counter()
            value = reward(captions, image_ids)
            seconds[name] = time.perf_counter() - start
            values[name] = self._check(name, value, len(captions))
            normalized[name] = self.normalizer(name, values[name], fit)
            total += self.weights[name] * normalized[name]
        return RewardOutput(total.float(), {k: v.float() for k, v in values.items()}, seconds,
                            {k: v.float() for k, v in normalized.items()})

    @staticmethod
    def _check(name: str, value: object, size: int) -> torch.Tensor:
        value = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
        if value.shape != (size,):
            raise RlcapError(f"reward {name!r} returned shape {tuple(value.shape)}, expected ({size},)")
        if not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            raise RlcapError(f"reward {name!r} returned {bad} non-finite value(s) (NaN/inf); stopping")
        return value


def _load_builtin() -> None:
    import rewards.clip.terms
    import rewards.text.terms  # noqa: F401  (each registers its family's rewards)
