"""The reference-based text family in the metric suite and the reward bank.

Metrics: bleu_1..4, rouge_l, cider, cider_d, meteor, spice. Rewards: cider_d (the SCST
workhorse), cider and bleu_4 over the batch, and length / constant for tests and ablations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plumbing.ptb import ptb_tokenize
from rewards.bank import register_reward
from rewards.context import ScoringContext
from rewards.suite import MetricOutput, MetricSpec, ScoringData, mean_output, register_metric
from rewards.text.batch import EvalBatch
from rewards.text.bleu import bleu
from rewards.text.cider import CiderD, corpus_cider
from rewards.text.meteor import Meteor, meteor_unavailable_reason
from rewards.text.rouge import rouge_l
from rewards.text.spice import spice_scores, spice_unavailable_reason

BLEU_NAMES = tuple(f"bleu_{n}" for n in range(1, 5))
LENGTH_NORM = 16.0  # the `length` reward is words / 16: about 1 for a long caption


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

    def __init__(self, ctx: ScoringContext):
        self.context = ctx

    def compute(self, data: ScoringData) -> MetricOutput:
        refs = {i: [r.split() for r in refs] for i, refs in zip(data.ids, data.references, strict=True)}
        scorer = CiderD(*self.context.document_frequencies, refs, use_eos=self.context.cider_eos)
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


register_metric(MetricSpec(BLEU_NAMES, lambda ctx: BleuMetric()))
register_metric(MetricSpec(("rouge_l",), lambda ctx: RougeMetric()))
register_metric(MetricSpec(("cider",), lambda ctx: CiderMetric()))
register_metric(MetricSpec(("cider_d",), CiderDMetric, lambda ctx: ctx.document_frequency_problem()))
register_metric(MetricSpec(("meteor",), lambda ctx: MeteorMetric(), lambda ctx: meteor_unavailable_reason(),
                           external=True))
register_metric(MetricSpec(("spice",), lambda ctx: SpiceMetric(), lambda ctx: spice_unavailable_reason(),
                           external=True))


def _tokenized_refs(context: ScoringContext) -> dict[int, list[list[str]]]:
    references = context.require_references("this reward")
    return {int(i): [ptb_tokenize(r).split() for r in refs] for i, refs in references.items()}


class CiderDReward:
    """CIDEr-D with training-corpus document frequencies; references vectorised once."""

    name = "cider_d"

    def __init__(self, context: ScoringContext):
        self.scorer = CiderD(*context.document_frequencies, _tokenized_refs(context), use_eos=context.cider_eos)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.from_numpy(self.scorer([c.split() for c in captions], image_ids))


class BatchReward:
    """cider / bleu_4 computed over the batch itself (document frequencies from the batch's refs)."""

    def __init__(self, name: str, context: ScoringContext):
        self.name = name
        self.refs = _tokenized_refs(context)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        batch = EvalBatch([c.split() for c in captions], [self.refs[int(i)] for i in image_ids])
        if self.name == "cider":
            return torch.from_numpy(corpus_cider(batch))
        return torch.from_numpy(bleu(batch)[1][:, 3])


class LengthReward:
    name = "length"

    def __init__(self, context: ScoringContext):
        pass

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([len(c.split()) / LENGTH_NORM for c in captions])


class ConstantReward:
    """1 for every caption: zero advantage under any baseline (a test of the SCST plumbing)."""

    name = "constant"

    def __init__(self, context: ScoringContext):
        pass

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.ones(len(captions))


register_reward("cider_d", CiderDReward)
register_reward("cider", lambda ctx: BatchReward("cider", ctx))
register_reward("bleu_4", lambda ctx: BatchReward("bleu_4", ctx))
register_reward("length", LengthReward)
register_reward("constant", ConstantReward)
