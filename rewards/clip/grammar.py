"""The `grammar` reward and metric (CLIP-Caption-Reward's grammar head): the probability that a caption
is well formed, read by a small head from a text tower.

A CLIP's contrastive text embedding hardly tells a caption from its corrupted copy (a head on the
frozen world CLIP's embedding reached 0.55 held-out accuracy, 0.65 standardised), so, as
CLIP-Caption-Reward does, the text tower is fine-tuned with the head. Here it is a copy of the `clip`
reward model's text tower: CLIP-S keeps reading the tower it had. `python -m rewards.train_grammar` trains
both on clean captions against corrupted ones (rewards/text/corrupt.py) and saves the tower and the head
in one safetensors file, with the fingerprint of the CLIP it started from; `reward_models.clip.grammar`
names it. Mixed with CLIP-S (`scst.rewards: {clip_s: 0.7, grammar: 0.3}`) it keeps a CLIP-S-only policy
from drifting into broken text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from plumbing.errors import ConfigError, DataError
from rewards.bank import register_reward
from rewards.context import ScoringContext
from rewards.suite import MetricOutput, MetricSpec, ScoringData, register_metric

RECIPE = ("train one with python -m rewards.train_grammar --arch ARCH --weights CLIP_WEIGHTS --dataset "
          "dataset.json --out grammar.safetensors, then name it as reward_models.clip.grammar "
          "(docs/reward_model_recipes.md)")


class GrammarHead(nn.Module):
    def __init__(self, embed_dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.scale = embed_dim ** 0.5  # unit vectors to entries of about 1

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Logits [N] of 'well formed' for normalised text embeddings [N, d]."""
        return self.net(embeddings * self.scale).squeeze(-1)


class GrammarModel(nn.Module):
    """A text tower (a reward model's, fine-tuned) and the head on its normalised embedding."""

    def __init__(self, reward_model, hidden: int = 256):  # reward_model: features' RewardModel
        super().__init__()
        self.reward_model = reward_model
        self.tower = reward_model.module
        width = int(self.tower.text_projection.shape[1])
        self.head = GrammarHead(width, hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.normalize(self.reward_model.encode_tokens(tokens).float(), dim=-1))

    def logits(self, captions: Sequence[str]) -> torch.Tensor:
        tokenizer = self.reward_model.tokenizer
        return self(tokenizer.padded(tokenizer.ids(captions)).to(next(self.parameters()).device))

    def text_state(self) -> dict[str, torch.Tensor]:
        """The fine-tuned text tower's tensors (the image tower stays the CLIP's and is not saved)."""
        return {k: v for k, v in self.tower.state_dict().items() if not k.startswith("visual.")}


def save_model(model: GrammarModel, path: str | Path, clip_fingerprint: str, arch: str) -> None:
    from safetensors.torch import save_file

    from plumbing.atomic import atomic_path

    head = model.head.net[0]
    tensors = {f"text.{k}": v for k, v in model.text_state().items()}
    tensors |= {f"head.{k}": v for k, v in model.head.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata={
            "clip_fingerprint": clip_fingerprint, "arch": arch, "embed_dim": str(head.in_features),
            "hidden": str(head.out_features)})


def load_model(path: str | Path, reward_model) -> GrammarModel:
    """The grammar model at `path` on a fresh copy of the CLIP it was trained from (`reward_model`,
    loaded by the caller); a file trained from another CLIP is refused."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise DataError(f"reward_models.clip.grammar: {path} not found; {RECIPE}")
    try:
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
        state = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise DataError(f"{path}: not a readable grammar model ({exc})") from None
    if meta.get("clip_fingerprint") != reward_model.fingerprint:
        raise DataError(f"{path}: this grammar model was trained from another CLIP (fingerprint "
                        f"{meta.get('clip_fingerprint')}, reward_models.clip is {reward_model.fingerprint}); "
                        f"retrain it: {RECIPE}")
    model = GrammarModel(reward_model, int(meta["hidden"]))
    text = {k[len("text."):]: v for k, v in state.items() if k.startswith("text.")}
    missing = [k for k in model.text_state() if k not in text]
    if missing:
        raise DataError(f"{path}: the text tower misses {missing[:3]}: not a grammar model of this CLIP's architecture")
    model.tower.load_state_dict(text, strict=False)
    model.head.load_state_dict({k[len("head."):]: v for k, v in state.items() if k.startswith("head.")})
    return model.eval()


class GrammarScorer:
    """P(well formed) of captions: its own copy of the `clip` model's text tower, fine-tuned, and the head."""

    def __init__(self, context: ScoringContext):
        from features.clip_models.factory import load_reward_model

        reason = grammar_unavailable(context)
        if reason:
            raise ConfigError(reason)
        device = context.clip_family.device
        spec = context.reward_models["clip"]
        if spec.kind != "open_clip":
            raise ConfigError(f"grammar: reward_models.clip is a {spec.kind} model; the grammar model fine-tunes an "
                              "open_clip text tower")
        self.model = load_model(spec.grammar, load_reward_model(spec, device, fresh=True)).to(device)

    @torch.no_grad()
    def __call__(self, captions: Sequence[str]) -> torch.Tensor:
        if not captions:
            return torch.empty(0)
        unique = list(dict.fromkeys(captions))
        values = dict(zip(unique, torch.sigmoid(self.model.logits(unique)).cpu().tolist(), strict=True))
        return torch.tensor([values[c] for c in captions])


def grammar_unavailable(context: ScoringContext) -> str | None:
    spec = context.reward_models.get("clip")
    if spec is None:
        return f"grammar reads the text tower of reward_models.clip, which is not configured; {RECIPE}"
    if not spec.grammar:
        return f"grammar needs a grammar head on reward_models.clip (its `grammar:` file); {RECIPE}"
    return None


class GrammarReward:
    name = "grammar"

    def __init__(self, context: ScoringContext):
        self.score = GrammarScorer(context)

    def __call__(self, captions: Sequence[str], image_ids: Sequence[int]) -> torch.Tensor:
        return self.score(captions)


class GrammarMetric:
    def __init__(self, context: ScoringContext):
        self.score = GrammarScorer(context)

    def compute(self, data: ScoringData) -> MetricOutput:
        values = self.score(data.raw_candidates).double().numpy()
        return MetricOutput({"grammar": float(np.mean(values)) if len(values) else 0.0},
                            {"grammar": [float(v) for v in values]})


register_reward("grammar", GrammarReward)
register_metric(MetricSpec(("grammar",), GrammarMetric, unavailable=grammar_unavailable,
                           reference_free=frozenset({"grammar"})))
