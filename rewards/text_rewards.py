"""Reference-based rewards: cider_d (the SCST workhorse), cider, bleu_4; and simple ones (length,
constant) for tests and ablations."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from captioner.errors import ConfigError
from rewards.bank import RewardContext, register_reward
from rewards.batch import EvalBatch
from rewards.bleu import bleu
from rewards.cider import CiderD, corpus_cider
from rewards.ptb import ptb_tokenize


def _tokenized_refs(context: RewardContext) -> dict[int, list[list[str]]]:
    if not context.references:
        raise ConfigError("this reward needs reference captions (data.refs)")
    return {int(i): [ptb_tokenize(r).split() for r in refs] for i, refs in context.references.items()}


class CiderDReward:
    """CIDEr-D with training-corpus document frequencies; references vectorised once."""

    name = "cider_d"

    def __init__(self, context: RewardContext):
        if not context.cider_df:
            raise ConfigError("reward 'cider_d' needs data.cider_df (cider_df.json.gz from captioner.prepro)")
        self.scorer = CiderD(context.cider_df, _tokenized_refs(context), use_eos=context.cider_eos)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.from_numpy(self.scorer([c.split() for c in captions], image_ids))


class BatchReward:
    """cider / bleu_4 computed over the batch itself (document frequencies from the batch's refs)."""

    def __init__(self, name: str, context: RewardContext):
        self.name = name
        self.refs = _tokenized_refs(context)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        batch = EvalBatch([c.split() for c in captions], [self.refs[int(i)] for i in image_ids])
        if self.name == "cider":
            return torch.from_numpy(corpus_cider(batch))
        return torch.from_numpy(bleu(batch)[1][:, 3])


class LengthReward:
    """Caption length in words divided by `length_norm` (default 16)."""

    name = "length"

    def __init__(self, context: RewardContext):
        self.norm = float(context.options.get("length_norm", 16))

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([len(c.split()) / self.norm for c in captions])


class ConstantReward:
    name = "constant"

    def __init__(self, context: RewardContext):
        self.value = float(context.options.get("constant", 1.0))

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return torch.full((len(captions),), self.value)


register_reward("cider_d", CiderDReward)
register_reward("cider", lambda ctx: BatchReward("cider", ctx))
register_reward("bleu_4", lambda ctx: BatchReward("bleu_4", ctx))
register_reward("length", LengthReward)
register_reward("constant", ConstantReward)
