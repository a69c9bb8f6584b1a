"""Registers the CLIP-family terms as rewards (the bank) and metrics (the suite).

Rewards and metrics built from one ScoringContext share its ClipFamily, so a model loads once per
process and all active terms on a model share one text pass per batch. Heavy imports (open_clip,
spaCy) happen only when a term is built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from plumbing.errors import ConfigError
from rewards.bank import register_reward
from rewards.context import ScoringContext
from rewards.suite import MetricOutput, MetricSpec, ScoringData, register_metric

MODEL_TERMS = {
    "clip": ("clip_s", "ref_clip_s", "f_clip_s"),
    "lclip": ("l_clip_s", "ref_l_clip_s"),
    "specs": ("specs",),
}


class ClipTermReward:
    def __init__(self, name: str, context: ScoringContext):
        self.name = name
        self.references = context.references
        self.family = context.clip_family
        self.family.activate(name, "reward")
        self.needs_refs = name.startswith("ref_")
        if self.needs_refs and not self.references:
            raise ConfigError(f"reward {name!r} needs reference captions (data.refs)")

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        refs = [self.references[int(i)] for i in image_ids] if self.family.needs_references("reward") else None
        return self.family.scores(captions, image_ids, refs, "reward")[self.name]


class ClipMetric:
    def __init__(self, context: ScoringContext, names: list[str]):
        self.names = names
        self.family = context.clip_family
        for name in names:
            self.family.activate(name, "metric")

    def compute(self, data: ScoringData) -> MetricOutput:
        scores = self.family.scores(data.raw_candidates, data.ids, data.raw_references, "metric")
        corpus, per_item = {}, {}
        for name in self.names:
            values = scores[name].double().numpy()
            corpus[name] = float(np.mean(values)) if len(values) else 0.0
            per_item[name] = [float(v) for v in values]
        return MetricOutput(corpus, per_item)


def _missing_model(model_key: str):
    def reason(context: ScoringContext) -> str | None:
        if model_key in context.reward_models:
            return None
        return f"no reward_models.{model_key} configured (kind, weights, embeds)"

    return reason


for _model_key, _names in MODEL_TERMS.items():
    register_metric(MetricSpec(_names, ClipMetric, unavailable=_missing_model(_model_key), wants_names=True,
                               reference_free=frozenset(n for n in _names if not n.startswith("ref_"))))
    for _name in _names:
        register_reward(_name, lambda ctx, name=_name: ClipTermReward(name, ctx))

from rewards.clip import grammar  # noqa: E402, F401  (the grammar head's reward and metric register there)
