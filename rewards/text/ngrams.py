"""Vectorised n-gram counting with stable integer ids.

Every n-gram gets an integer id that stays the same for the life of an NgramIndex, so reference
vectors can be computed once and reused (the SCST reward path), and document frequencies from a
file can be looked up by id. Counting is done in numpy over all sentences of a batch at once;
Python touches each distinct n-gram of a batch once, not each occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import numpy as np

MAX_N = 4
_PAIR = np.int64(1) << np.int64(31)  # ids stay below 2**31, so (prefix, word) pairs fit an int64
_SENT = np.int64(1) << np.int64(34)  # sentence index * _SENT + gram id stays within int64


@dataclass
class SentenceGrams:
    """Term frequencies of n sentences: one row per (sentence, distinct n-gram)."""

    sentence: np.ndarray  # int64 [E], sorted ascending
    gram: np.ndarray  # int64 [E], global gram id (id * MAX_N + order - 1)
    count: np.ndarray  # float64 [E]
    lengths: np.ndarray  # int64 [n_sentences], tokens per sentence

    @property
    def order(self) -> np.ndarray:
        """0-based n-gram order of each row (0 = unigram)."""
        return self.gram % MAX_N

    @property
    def n_sentences(self) -> int:
        return len(self.lengths)



    def slice(self, first: int, last: int) -> SentenceGrams:
        """Sentences first..last-1, renumbered from 0."""
        lo, hi = np.searchsorted(self.sentence, [first, last])
        return SentenceGrams(self.sentence[lo:hi] - first, self.gram[lo:hi], self.count[lo:hi],
                             self.lengths[first:last])


class NgramIndex:
    """Gram ids for sentences.

    persistent=True keeps every id for the life of the index (cached reference vectors stay
    valid across calls). persistent=False numbers grams afresh on each `count` call, which is
    faster but only meaningful within one call: count candidates and references together.
    """

    def __init__(self, max_n: int = MAX_N, persistent: bool = True):
        if max_n > MAX_N:
            raise ValueError(f"max_n must be <= {MAX_N}")
        self.max_n = max_n
        self.persistent = persistent
        self.words: dict[str, int] = {}
        self.levels: list[dict[int, int]] = [{} for _ in range(MAX_N)]

    def _word_ids(self, tokens: list[str]) -> np.ndarray:
        words = self.words
        for word in set(tokens).difference(words):
            words[word] = len(words)
        return lookup(words, tokens)

    def _intern(self, level: int, keys: np.ndarray) -> np.ndarray:
        uniq, inverse = np.unique(keys, return_inverse=True)
        if not self.persistent:
            return inverse.astype(np.int64)
        table = self.levels[level]
        uniq_list = uniq.tolist()
        start = len(table)
        table.update(zip(set(uniq_list).difference(table), range(start, start + len(uniq_list)), strict=False))
        ids = np.fromiter(map(table.__getitem__, uniq_list), dtype=np.int64, count=len(uniq_list))
        return ids[inverse]

    def count(self, sentences: Sequence[Sequence[str]]) -> SentenceGrams:
        """Count the 1..max_n-grams of each token list."""
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        flat = self._word_ids(list(chain.from_iterable(sentences)))
        owner = np.repeat(np.arange(len(sentences), dtype=np.int64), lengths)
        remaining = tokens_left(lengths)  # an n-gram starting at a token stays inside its sentence if > n - 1
        pos, ids = np.arange(len(flat), dtype=np.int64), flat  # word ids are already stable unigram ids
        keys = [owner * _SENT + ids * MAX_N]
        for level in range(1, self.max_n):
            # the gram of order level+1 at i is (the gram of order level at i, the word at i+level)
            inside = remaining[pos] > level
            pos, ids = pos[inside], ids[inside]
            if not len(pos):
                break
            ids = self._intern(level, ids * _PAIR + flat[pos + level])
            keys.append(owner[pos] * _SENT + ids * MAX_N + level)
        keys, counts = run_counts(np.concatenate(keys))
        return SentenceGrams(keys // _SENT, keys % _SENT, counts, lengths)

    def gram_ids(self, grams: Sequence[Sequence[str]]) -> np.ndarray:
        """Global ids of whole n-grams (e.g. the keys of a document-frequency table)."""
        counted = self.count(grams)
        lengths = np.asarray([len(g) for g in grams], dtype=np.int64)
        full = counted.order == (lengths[counted.sentence] - 1)
        out = np.full(len(grams), -1, dtype=np.int64)
        out[counted.sentence[full]] = counted.gram[full]
        return out


def group_keys(a: np.ndarray, b: np.ndarray, width: np.int64 = _SENT) -> np.ndarray:
    """One sortable int64 key for (a, b) pairs with 0 <= b < width."""
    return a.astype(np.int64) * width + b


def lookup(table: dict[str, int], tokens: list[str]) -> np.ndarray:
    """table[token] for every token; itemgetter looks them all up in one C loop (a map over
    __getitem__ costs 2-3x more)."""
    if len(tokens) < 2:  # itemgetter of one key returns the value, not a tuple
        return np.asarray([table[t] for t in tokens], dtype=np.int64)
    return np.fromiter(itemgetter(*tokens)(table), dtype=np.int64, count=len(tokens))


def tokens_left(lengths: np.ndarray) -> np.ndarray:
    """For each token of the flattened sentences, how many tokens its sentence has from it on."""
    return np.repeat(np.cumsum(lengths), lengths) - np.arange(int(lengths.sum()), dtype=np.int64)


def run_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, how often each occurs)."""
    keys = np.sort(keys)
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
    return keys[first], np.diff(np.r_[first, len(keys)]).astype(np.float64)
