"""One evaluation batch: tokenised candidates (one per image) and their references, with the
n-gram counts that BLEU and CIDEr share computed once."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from itertools import chain

import numpy as np

from rewards.text.ngrams import NgramIndex, SentenceGrams


class EvalBatch:
    def __init__(self, candidates: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]):
        if len(candidates) != len(references):
            raise ValueError(f"{len(candidates)} candidates but {len(references)} reference lists")
        self.candidates = candidates  # token lists, read only
        self.references = references

    def __len__(self) -> int:
        return len(self.candidates)

    @cached_property
    def n_refs(self) -> np.ndarray:
        return np.asarray([len(r) for r in self.references], dtype=np.int64)

    @cached_property
    def ref_row(self) -> np.ndarray:
        """Image row of each reference sentence."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.n_refs)

    @cached_property
    def hyp_lengths(self) -> np.ndarray:
        """Tokens per candidate."""
        return np.fromiter(map(len, self.candidates), dtype=np.int64, count=len(self.candidates))

    @cached_property
    def ref_lengths(self) -> np.ndarray:
        """Tokens per reference sentence, all references in row order."""
        return np.fromiter(map(len, chain.from_iterable(self.references)), dtype=np.int64, count=int(self.n_refs.sum()))

    @property
    def has_counts(self) -> bool:
        """Whether the shared n-gram counts have been computed (they are, on first use)."""
        return "_grams" in self.__dict__

    @cached_property
    def _grams(self) -> tuple[SentenceGrams, SentenceGrams]:
        ref_sentences = [s for refs in self.references for s in refs]
        counted = NgramIndex(persistent=False).count([*ref_sentences, *self.candidates])
        return counted.slice(0, len(ref_sentences)), counted.slice(len(ref_sentences), counted.n_sentences)

    @property
    def ref_grams(self) -> SentenceGrams:
        return self._grams[0]

    @property
    def hyp_grams(self) -> SentenceGrams:
        return self._grams[1]

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(candidate row, reference sentence) for every reference of every candidate, grouped by row."""
        first = np.cumsum(self.n_refs) - self.n_refs
        pair_row = self.ref_row
        return pair_row, first[pair_row] + (np.arange(len(pair_row)) - first[pair_row])
