"""BLEU-1..4 as coco-caption computes it (pycocoevalcap BleuScorer, option "closest"),
vectorised over the batch: per item and corpus, with the same tiny/small smoothing constants."""

from __future__ import annotations

import numpy as np

from rewards.text.batch import EvalBatch
from rewards.text.ngrams import MAX_N, group_keys

TINY = 1e-15
SMALL = 1e-9


_COUNT_BITS = 8  # counts of one n-gram in one reference fit in 8 bits (min'ed with 255: clipping is exact below)


def _clipped_matches(batch: EvalBatch) -> np.ndarray:
    """correct[i, k]: candidate k+1-grams also in a reference, clipped by the max reference count."""
    ref, hyp = batch.ref_grams, batch.hyp_grams
    # One sort of (image row, gram, count) packed in an int64 gives, per (row, gram), its max count last.
    counts = np.minimum(ref.count, (1 << _COUNT_BITS) - 1).astype(np.int64)
    width = np.int64(max(ref.gram.max(initial=0), hyp.gram.max(initial=0)) + 1)  # compact: keys stay small
    packed = np.sort((group_keys(batch.ref_row[ref.sentence], ref.gram, width) << _COUNT_BITS) | counts)
    keys = packed >> _COUNT_BITS
    last = np.flatnonzero(np.r_[keys[1:] != keys[:-1], True]) if len(keys) else np.zeros(0, np.int64)
    uniq, max_count = keys[last], (packed[last] & ((1 << _COUNT_BITS) - 1)).astype(np.float64)
    hkeys = group_keys(hyp.sentence, hyp.gram, width)
    pos = np.minimum(np.searchsorted(uniq, hkeys), max(len(uniq) - 1, 0))
    found = uniq[pos] == hkeys if len(uniq) else np.zeros(len(hkeys), bool)
    clipped = np.where(found, np.minimum(hyp.count, max_count[pos] if len(uniq) else 0), 0.0)
    correct = np.bincount(hyp.sentence * MAX_N + hyp.order, weights=clipped, minlength=len(batch) * MAX_N)
    return correct.reshape(len(batch), MAX_N)


def _closest_ref_length(batch: EvalBatch, test_len: np.ndarray) -> np.ndarray:
    """Length of the reference closest in length to the candidate; ties go to the shorter one."""
    pair_row, pair_ref = batch.pairs()
    ref_len = batch.ref_grams.lengths[pair_ref]
    score = np.abs(ref_len - test_len[pair_row]) * (1 << 20) + ref_len
    first = np.cumsum(batch.n_refs) - batch.n_refs
    return np.minimum.reduceat(score, first) % (1 << 20)


def bleu(batch: EvalBatch) -> tuple[np.ndarray, np.ndarray]:
    """(corpus [4], per_item [N, 4]) BLEU-1..4."""
    test_len = batch.hyp_grams.lengths.astype(np.int64)
    ref_len = _closest_ref_length(batch, test_len).astype(np.float64)
    correct = _clipped_matches(batch)
    guess = np.maximum(0, test_len[:, None] - np.arange(MAX_N)[None, :]).astype(np.float64)
    per_item = _bleu_from_counts(correct, guess, test_len.astype(np.float64), ref_len)
    corpus = _bleu_from_counts(correct.sum(0, keepdims=True), guess.sum(0, keepdims=True),
                               np.array([float(test_len.sum())]), np.array([ref_len.sum()]))[0]
    return corpus, per_item


def _bleu_from_counts(correct: np.ndarray, guess: np.ndarray, test_len: np.ndarray,
                      ref_len: np.ndarray) -> np.ndarray:
    precision = np.cumprod((correct + TINY) / (guess + SMALL), axis=1)
    scores = precision ** (1.0 / np.arange(1, MAX_N + 1))[None, :]
    ratio = (test_len + TINY) / (ref_len + SMALL)
    with np.errstate(over="ignore", divide="ignore"):
        brevity = np.where(ratio < 1, np.exp(1 - 1 / ratio), 1.0)
    return scores * brevity[:, None]
