"""The CLIP-family terms of one process, computed together.

Every active term (clip_s, ref_clip_s, f_clip_s on the `clip` model; l_clip_s, ref_l_clip_s on
`lclip`; specs on `specs`) asks for texts on its model; per model the union of those texts goes
through one EmbeddingScorer pass (unique strings, trimmed micro-batches), and every term reads
its embeddings from that pass. A term's value does not depend on which other terms are active.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from features.clip_models.factory import RewardModelSpec, load_reward_model
from plumbing.device import pick_device
from plumbing.errors import ConfigError
from rewards.clip import formulas as score
from rewards.clip.scorer import EmbeddingScorer


@dataclass(frozen=True)
class Term:
    model: str  # key in the reward_models config section
    formula: str  # clip_s | ref | fine | specs


TERMS: dict[str, Term] = {
    "clip_s": Term("clip", "clip_s"),
    "ref_clip_s": Term("clip", "ref"),
    "f_clip_s": Term("clip", "fine"),
    "l_clip_s": Term("lclip", "clip_s"),
    "ref_l_clip_s": Term("lclip", "ref"),
    "specs": Term("specs", "specs"),
}
PREFIXED = {"clip_s", "ref"}  # Hessel et al. prefix "A photo depicts " on captions and references


class ClipFamily:
    def __init__(self, specs: Mapping[str, RewardModelSpec], device: str = "auto"):
        self.specs = dict(specs)
        self.device = pick_device(device)
        self.active: list[str] = []
        self.groups: dict[str, list[str]] = {}  # who asked for which terms: "reward", "metric"
        self.scorers: dict[str, EmbeddingScorer] = {}
        self._nouns = None
        self._memo: tuple[tuple, dict[str, torch.Tensor]] | None = None

    def activate(self, name: str, group: str = "reward") -> None:
        term = TERMS[name]
        if term.model not in self.specs:
            raise ConfigError(f"{name} needs reward_models.{term.model} (kind, weights, embeds); "
                              f"configured reward models: {', '.join(self.specs) or 'none'}")
        self.scorer(term.model)
        if term.formula == "fine" and self._nouns is None:
            from rewards.clip.nouns import (
                NounParser,  # spaCy loads only when f_clip_s is used
            )

            self._nouns = NounParser()
        if name not in self.active:
            self.active.append(name)
        members = self.groups.setdefault(group, [])
        if name not in members:
            members.append(name)

    def scorer(self, model_key: str) -> EmbeddingScorer:
        """The model's scorer, loaded on first use (one per model and process, whatever reads it)."""
        if model_key not in self.scorers:
            spec = self.specs[model_key]
            model = load_reward_model(spec, self.device)
            self.scorers[model_key] = EmbeddingScorer(model, spec.embeds or None, spec.precision, spec.token_budget,
                                                      spec.cache_size)
        return self.scorers[model_key]

    def clear_caches(self, keep_embeddings: bool = False) -> None:
        """Forget the memoised batch and, unless kept, cached embeddings and parses (benchmarks)."""
        self._memo = None
        if keep_embeddings:
            return
        for scorer in self.scorers.values():
            scorer.cache.clear()
        if self._nouns is not None:
            self._nouns.clear()

    def needs_references(self, group: str) -> bool:
        return any(TERMS[n].formula == "ref" for n in self.groups.get(group, ()))

    def scores(self, captions: Sequence[str], image_ids: Sequence[int],
               references: Sequence[Sequence[str]] | None = None, group: str = "reward") -> dict[str, torch.Tensor]:
        """Every term of `group` for this batch, one text pass per model. The last batch is
        memoised, so after the first term's reward call the others are free."""
        active = self.groups.get(group, [])
        key = (group, tuple(active), tuple(captions), tuple(int(i) for i in image_ids),
               tuple(map(tuple, references or ())))
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        out: dict[str, torch.Tensor] = {}
        for model_key in dict.fromkeys(TERMS[n].model for n in active):
            names = [n for n in active if TERMS[n].model == model_key]
            out.update(self._model_scores(model_key, names, list(captions), image_ids, references))
        self._memo = (key, out)
        return out

    def _model_scores(self, model_key: str, names: list[str], captions: list[str], image_ids: Sequence[int],
                      references: Sequence[Sequence[str]] | None) -> dict[str, torch.Tensor]:
        scorer = self.scorers[model_key]
        formulas = {TERMS[n].formula for n in names}
        prefixed = [score.CLIP_S_PREFIX + c for c in captions]
        texts, cached = [], []
        if formulas & PREFIXED:
            texts += prefixed
        if formulas & {"fine", "specs"}:
            texts += captions
        refs = self._references(references, len(captions)) if "ref" in formulas else None
        if refs is not None:
            cached += [score.CLIP_S_PREFIX + r for rs in refs for r in rs]
        nouns = self._nouns(captions) if "fine" in formulas else None
        if nouns is not None:
            cached += [n for ns in nouns for n in ns]
        table = scorer.text_embeddings(texts + cached, cached)
        image = scorer.image_embeddings(image_ids)
        stack = _stacker(table, image)
        out = {}
        for name in names:
            formula = TERMS[name].formula
            if formula == "clip_s":
                out[name] = score.clip_s(image, stack(prefixed))
            elif formula == "ref":
                ref_rows = [stack([score.CLIP_S_PREFIX + r for r in rs]) for rs in refs]
                out[name] = score.ref_clip_s(image, stack(prefixed), ref_rows)
            elif formula == "fine":
                out[name] = score.f_clip_s(image, stack(captions), [stack(list(ns)) for ns in nouns])
            else:
                out[name] = score.specs(image, stack(captions))
        return {k: v.float().cpu() for k, v in out.items()}

    @staticmethod
    def _references(references: Sequence[Sequence[str]] | None, size: int) -> list[list[str]]:
        if references is None or len(references) != size:
            raise ConfigError("reference-based CLIP terms (ref_clip_s, ref_l_clip_s) need references per caption")
        return [list(r) for r in references]


def _stacker(table: dict[str, torch.Tensor], image: torch.Tensor):
    dim = image.shape[1]

    def stack(texts: list[str]) -> torch.Tensor:
        if not texts:
            return image.new_zeros(0, dim)
        return torch.stack([table[t] for t in texts])

    return stack
