"""BLEU-1..4 as coco-caption computes it (pycocoevalcap BleuScorer, option "closest"),
vectorised over the batch: per item and corpus, with the same tiny/small smoothing constants.

Clipped matches come one of two ways, with the same result to the bit:
- from the batch's shared n-gram counts, when CIDEr (or anything else) has already counted them;
- otherwise directly (`_direct_matches`): only n-grams of a candidate can match, so words no
  candidate uses never get an id and reference n-grams are looked up among the candidates' own,
  which is several times cheaper than counting every reference n-gram.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from rewards.text.batch import EvalBatch
from rewards.text.ngrams import MAX_N, group_keys, lookup, run_counts, tokens_left

TINY = 1e-15
SMALL = 1e-9


_COUNT_BITS = 8  # counts of one n-gram in one reference fit in 8 bits (min'ed with 255: clipping is exact below)
_COUNT_MASK = (1 << _COUNT_BITS) - 1


def _max_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, the largest count of each): one sort of (key, count) packed in an int64."""
    packed = np.sort((keys << _COUNT_BITS) | np.minimum(counts, _COUNT_MASK).astype(np.int64))
    keys = packed >> _COUNT_BITS
    last = np.flatnonzero(np.r_[keys[1:] != keys[:-1], True]) if len(keys) else np.zeros(0, np.int64)
    return keys[last], (packed[last] & _COUNT_MASK).astype(np.float64)


def _lookup(table_keys: np.ndarray, table_values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """table_values at keys found in sorted table_keys, 0 elsewhere."""
    if not len(table_keys):
        return np.zeros(len(keys))
    pos = np.minimum(np.searchsorted(table_keys, keys), len(table_keys) - 1)
    return np.where(table_keys[pos] == keys, table_values[pos], 0.0)


def _shared_matches(batch: EvalBatch) -> np.ndarray:
    """correct[i, k]: candidate k+1-grams also in a reference, clipped by the max reference count,
    from the batch's shared n-gram counts."""
    ref, hyp = batch.ref_grams, batch.hyp_grams
    width = np.int64(max(ref.gram.max(initial=0), hyp.gram.max(initial=0)) + 1)  # compact: keys stay small
    uniq, max_count = _max_by_key(group_keys(batch.ref_row[ref.sentence], ref.gram, width), ref.count)
    clipped = np.minimum(hyp.count, _lookup(uniq, max_count, group_keys(hyp.sentence, hyp.gram, width)))
    correct = np.bincount(hyp.sentence * MAX_N + hyp.order, weights=clipped, minlength=len(batch) * MAX_N)
    return correct.reshape(len(batch), MAX_N)


def _direct_matches(batch: EvalBatch) -> np.ndarray | None:
    """The same as `_shared_matches`, counting only what can match; None when the candidates'
    vocabulary is too large to pack a 4-gram of word ids in an int64."""
    candidates = batch.candidates
    vocab = {word: k for k, word in enumerate(set(chain.from_iterable(candidates)), start=1)}  # 0: no candidate's
    base = len(vocab) + 1
    if base ** MAX_N >= 1 << 62:
        return None
    hyp_ids = lookup(vocab, list(chain.from_iterable(candidates)))
    ref_sentences = [s for refs in batch.references for s in refs]
    ref_ids = _ids_or_zero(vocab, list(chain.from_iterable(ref_sentences)))
    hyp_owner = np.repeat(np.arange(len(batch), dtype=np.int64), batch.hyp_lengths)
    ref_owner = np.repeat(np.arange(len(ref_sentences), dtype=np.int64), batch.ref_lengths)
    hyp_left, ref_left = tokens_left(batch.hyp_lengths), tokens_left(batch.ref_lengths)
    correct = np.zeros((len(batch), MAX_N))
    hyp_code, ref_code, alive = hyp_ids, ref_ids, ref_ids > 0
    for n in range(1, MAX_N + 1):
        if n > 1:  # the n-gram at i is the (n-1)-gram at i followed by the word at i+n-1
            hyp_code = hyp_code[:-1] * base + hyp_ids[n - 1:]
            ref_code = ref_code[:-1] * base + ref_ids[n - 1:]
            alive = alive[:-1] & alive[1:]  # both its (n-1)-grams must be some candidate's
        inside = hyp_left[: len(hyp_code)] >= n
        grams, gram_of = np.unique(hyp_code[inside], return_inverse=True)
        width = np.int64(max(len(grams), 1))
        hyp_keys, hyp_counts = run_counts(hyp_owner[: len(hyp_code)][inside] * width + gram_of)
        # reference n-grams that are some candidate's n-gram, by (reference sentence, gram)
        where = np.flatnonzero(alive & (ref_left[: len(ref_code)] >= n))
        if n == 1:  # every vocabulary word is some candidate's: unigram k is word id k + 1
            at, hit = ref_code[where] - 1, np.ones(len(where), bool)
        else:
            at = np.minimum(np.searchsorted(grams, ref_code[where]), len(grams) - 1) if len(grams) else where * 0
            hit = grams[at] == ref_code[where] if len(grams) else np.zeros(len(where), bool)
        alive = np.zeros(len(ref_code), bool)
        alive[where[hit]] = True
        ref_keys, ref_counts = run_counts(ref_owner[where[hit]] * width + at[hit])
        row_keys = batch.ref_row[ref_keys // width] * width + ref_keys % width
        uniq, max_count = _max_by_key(row_keys, ref_counts)
        clipped = np.minimum(hyp_counts, _lookup(uniq, max_count, hyp_keys))
        correct[:, n - 1] = np.bincount(hyp_keys // width, weights=clipped, minlength=len(batch))
    return correct


def _ids_or_zero(vocab: dict[str, int], tokens: list[str]) -> np.ndarray:
    """vocab ids of tokens, 0 for words not in vocab: the unknown words get ids past the vocabulary
    first, so one itemgetter pass looks every token up, and a table sends those ids to 0."""
    unknown = set(tokens).difference(vocab)
    everything = {**vocab, **dict(zip(unknown, range(len(vocab) + 1, len(vocab) + 1 + len(unknown)), strict=True))}
    table = np.zeros(len(everything) + 1, dtype=np.int64)
    table[1: len(vocab) + 1] = np.arange(1, len(vocab) + 1)
    return table[lookup(everything, tokens)]


def clipped_matches(batch: EvalBatch) -> np.ndarray:
    if batch.has_counts:
        return _shared_matches(batch)
    direct = _direct_matches(batch)
    return _shared_matches(batch) if direct is None else direct


def _closest_ref_length(batch: EvalBatch, test_len: np.ndarray) -> np.ndarray:
    """Length of the reference closest in length to the candidate; ties go to the shorter one."""
    pair_row, pair_ref = batch.pairs()
    ref_len = batch.ref_lengths[pair_ref]
    score = np.abs(ref_len - test_len[pair_row]) * (1 << 20) + ref_len
    first = np.cumsum(batch.n_refs) - batch.n_refs
    return np.minimum.reduceat(score, first) % (1 << 20)


def bleu(batch: EvalBatch) -> tuple[np.ndarray, np.ndarray]:
    """(corpus [4], per_item [N, 4]) BLEU-1..4."""
    test_len = batch.hyp_lengths
    ref_len = _closest_ref_length(batch, test_len).astype(np.float64)
    correct = clipped_matches(batch)
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
