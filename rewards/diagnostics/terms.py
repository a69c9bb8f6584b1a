"""The diagnostics in the metric suite: text statistics of any captions, and grounding against
the offline world's scene graphs."""

from __future__ import annotations

from rewards.context import ScoringContext
from rewards.diagnostics.grounding import grounding
from rewards.diagnostics.text import text_diagnostics
from rewards.suite import MetricOutput, MetricSpec, ScoringData, register_metric

TEXT_DIAGNOSTICS = ("mean_length", "vocab_used", "distinct_1", "distinct_2", "repeat_2", "bad_ending")
GROUNDING = ("object_recall", "hallucination_mention", "hallucination_caption", "attribute_error")


class TextDiagnostics:
    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = text_diagnostics(data.candidates)
        return MetricOutput(corpus, items)


class GroundingMetric:
    def __init__(self, ctx: ScoringContext):
        self.scenes = ctx.world_scenes

    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = grounding(data.ids, data.raw_candidates, self.scenes)
        return MetricOutput(corpus, items)


def _needs_scenes(ctx: ScoringContext) -> str | None:
    return None if ctx.scenes else "grounding diagnostics need the offline world's scenes.json (--scenes)"


register_metric(MetricSpec(TEXT_DIAGNOSTICS, lambda ctx: TextDiagnostics(),
                           lower_is_better=frozenset({"repeat_2", "bad_ending"}),
                           no_direction=frozenset({"mean_length"}), reference_free=frozenset(TEXT_DIAGNOSTICS)))
register_metric(MetricSpec(GROUNDING, GroundingMetric, _needs_scenes,
                           lower_is_better=frozenset(GROUNDING) - {"object_recall"},
                           reference_free=frozenset(GROUNDING)))
