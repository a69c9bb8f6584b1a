"""Registration of the reference-based metrics and the diagnostics in the metric suite."""

from __future__ import annotations

from pathlib import Path

from rewards.bleu import bleu
from rewards.cider import CiderD, corpus_cider
from rewards.diagnostics import grounding, load_scenes, text_diagnostics
from rewards.meteor import Meteor, meteor_unavailable_reason
from rewards.rouge import rouge_l
from rewards.spice import spice_scores, spice_unavailable_reason
from rewards.suite import (
    MetricContext,
    MetricOutput,
    MetricSpec,
    ScoringData,
    mean_output,
    register_metric,
)

BLEU_NAMES = tuple(f"bleu_{n}" for n in range(1, 5))
TEXT_DIAGNOSTICS = ("mean_length", "vocab_used", "distinct_1", "distinct_2", "repeat_2", "bad_ending")
GROUNDING = ("object_recall", "hallucination_mention", "hallucination_caption", "attribute_error")


class BleuMetric:
    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = bleu(data.batch)
        return MetricOutput({n: float(corpus[k]) for k, n in enumerate(BLEU_NAMES)},
                            {n: items[:, k].tolist() for k, n in enumerate(BLEU_NAMES)})


class RougeMetric:
    def compute(self, data: ScoringData) -> MetricOutput:
        return mean_output("rouge_l", rouge_l(data.candidates, data.references))


class CiderMetric:
    def compute(self, data: ScoringData) -> MetricOutput:
        return mean_output("cider", corpus_cider(data.batch))


class CiderDMetric:
    """cider_d scored with training-corpus df; references are those of the scored items."""

    def __init__(self, ctx: MetricContext):
        self.df_path, self.use_eos = ctx.cider_df, ctx.cider_eos

    def compute(self, data: ScoringData) -> MetricOutput:
        refs = {i: [r.split() for r in refs] for i, refs in zip(data.ids, data.references, strict=True)}
        scorer = CiderD(self.df_path, refs, use_eos=self.use_eos)
        return mean_output("cider_d", scorer([c.split() for c in data.candidates], data.ids))


class MeteorMetric:
    def __init__(self) -> None:
        self.meteor = Meteor()

    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = self.meteor.score(data.candidates, data.references)
        return MetricOutput({"meteor": corpus}, {"meteor": items})

    def close(self) -> None:
        self.meteor.close()


class SpiceMetric:
    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = spice_scores(data.ids, data.candidates, data.references)
        return MetricOutput({"spice": corpus}, {"spice": items})


class TextDiagnostics:
    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = text_diagnostics(data.candidates)
        return MetricOutput(corpus, items)


class GroundingMetric:
    def __init__(self, ctx: MetricContext):
        self.scenes = load_scenes(ctx.scenes)

    def compute(self, data: ScoringData) -> MetricOutput:
        corpus, items = grounding(data.ids, data.raw_candidates, self.scenes)
        return MetricOutput(corpus, items)


def _needs_df(ctx: MetricContext) -> str | None:
    if not ctx.cider_df:
        return "cider_d needs training-corpus document frequencies (--cider-df, written by captioner.prepro)"
    return None if Path(ctx.cider_df).exists() else f"cider_d: {ctx.cider_df} not found"


def _needs_scenes(ctx: MetricContext) -> str | None:
    return None if ctx.scenes else "grounding diagnostics need the offline world's scenes.json (--scenes)"


register_metric(MetricSpec(BLEU_NAMES, lambda ctx: BleuMetric()))
register_metric(MetricSpec(("rouge_l",), lambda ctx: RougeMetric()))
register_metric(MetricSpec(("cider",), lambda ctx: CiderMetric()))
register_metric(MetricSpec(("cider_d",), CiderDMetric, _needs_df))
register_metric(MetricSpec(("meteor",), lambda ctx: MeteorMetric(), lambda ctx: meteor_unavailable_reason()))
register_metric(MetricSpec(("spice",), lambda ctx: SpiceMetric(), lambda ctx: spice_unavailable_reason()))
register_metric(MetricSpec(TEXT_DIAGNOSTICS, lambda ctx: TextDiagnostics()))
register_metric(MetricSpec(GROUNDING, GroundingMetric, _needs_scenes))

