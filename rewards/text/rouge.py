"""ROUGE-L as pycocoevalcap computes it (beta 1.2, max precision and recall over references),
with a bit-parallel longest-common-subsequence instead of the O(n·m) table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BETA = 1.2


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Allison–Dix / Hyyrö bit-vector LCS: one pass over b, |a| bits per word."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, token in enumerate(a):
        masks[token] = masks.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for token in b:
        match = row & masks.get(token, 0)
        row = ((row + match) | (row - match)) & full
    return len(a) - row.bit_count()


def rouge_l_one(candidate: str, references: Sequence[str]) -> float:
    # split(" ") as the reference does: an empty caption is one empty token, not none.
    cand = candidate.split(" ")
    best_p = best_r = 0.0
    for ref in references:
        tokens = ref.split(" ")
        lcs = lcs_length(tokens, cand)
        best_p = max(best_p, lcs / float(len(cand)))
        best_r = max(best_r, lcs / float(len(tokens)))
    if best_p != 0 and best_r != 0:
        return ((1 + BETA ** 2) * best_p * best_r) / float(best_r + BETA ** 2 * best_p)
    return 0.0


def rouge_l(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
    """Per-item ROUGE-L of tokenised (space-joined) candidates; the corpus score is the mean."""
    return np.asarray([rouge_l_one(c, refs) for c, refs in zip(candidates, references, strict=True)])
