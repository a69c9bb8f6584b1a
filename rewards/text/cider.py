"""CIDEr-D, vectorised: `cider` (document frequencies from the evaluated set, as pycocoevalcap's
Cider) and `cider_d` (document frequencies from the training corpus, the SCST reward).

Both follow pycocoevalcap's CiderScorer to the last detail: tf-idf vectors per n-gram order,
idf = log(N) - log(max(1, df)), clipped overlap min(h, r)·r, the Gaussian length penalty with
sigma 6 on the bigram counts, mean over n = 1..4, mean over references, times 10.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from plumbing.errors import DataError
from rewards.text.batch import EvalBatch
from rewards.text.cider_df import EOS_TOKEN
from rewards.text.ngrams import MAX_N, NgramIndex, SentenceGrams, group_keys

SIGMA = 6.0


@dataclass
class DocFreq:
    """log(max(1, df)) by gram id (ids are compact, so a dense table); unknown grams have df 0."""

    log_df: np.ndarray
    log_n_docs: float

    @classmethod
    def from_counts(cls, grams: np.ndarray, counts: np.ndarray, n_docs: int) -> DocFreq:
        table = np.zeros(int(grams.max()) + 1 if len(grams) else 0)
        table[grams] = np.log(np.maximum(1.0, counts))
        return cls(table, float(np.log(float(n_docs))))

    def idf(self, grams: np.ndarray) -> np.ndarray:
        known = grams < len(self.log_df)
        log_df = np.zeros(len(grams))
        log_df[known] = self.log_df[grams[known]]
        return self.log_n_docs - log_df


@dataclass
class RefTable:
    """Reference tf-idf vectors of a set of images, sorted for joining with candidates."""

    keys: np.ndarray  # (image row, gram) keys of every reference entry, sorted
    entry_sentence: np.ndarray  # reference sentence of each sorted entry
    weight: np.ndarray  # tf-idf weight of each sorted entry
    norms: np.ndarray  # [n_ref_sentences, MAX_N]
    lengths: np.ndarray  # bigram count of each reference sentence (pycocoevalcap's "length")
    first: np.ndarray  # [n_images] first reference sentence of each image row
    n_refs: np.ndarray  # [n_images]


def _norms(sentence: np.ndarray, order: np.ndarray, weight: np.ndarray, n_sentences: int) -> np.ndarray:
    sq = np.bincount(sentence * MAX_N + order, weights=weight * weight, minlength=n_sentences * MAX_N)
    return np.sqrt(sq).reshape(n_sentences, MAX_N)


def _bigram_length(lengths: np.ndarray) -> np.ndarray:
    return np.maximum(lengths - 1, 0)


def build_ref_table(grams: SentenceGrams, n_refs: np.ndarray, df: DocFreq) -> RefTable:
    first = np.cumsum(n_refs) - n_refs
    row_of_sentence = np.repeat(np.arange(len(n_refs), dtype=np.int64), n_refs)
    weight = grams.count * df.idf(grams.gram)
    keys = group_keys(row_of_sentence[grams.sentence], grams.gram)
    order = np.argsort(keys)  # ties (one gram in several references) may come in any order
    return RefTable(keys[order], grams.sentence[order], weight[order],
                    _norms(grams.sentence, grams.order, weight, grams.n_sentences),
                    _bigram_length(grams.lengths), first, n_refs)


def score_candidates(table: RefTable, hyp: SentenceGrams, rows: np.ndarray, df: DocFreq,
                     sigma: float = SIGMA) -> np.ndarray:
    """CIDEr-D of candidate i against the references of image row rows[i]."""
    n_hyp = hyp.n_sentences
    hyp_w = hyp.count * df.idf(hyp.gram)
    hyp_norm = _norms(hyp.sentence, hyp.order, hyp_w, n_hyp)
    # Every (candidate, reference) pair of the same image, numbered consecutively per candidate.
    refs_per_hyp = table.n_refs[rows]
    pair_start = np.cumsum(refs_per_hyp) - refs_per_hyp
    n_pairs = int(refs_per_hyp.sum())
    pair_hyp = np.repeat(np.arange(n_hyp, dtype=np.int64), refs_per_hyp)
    pair_ref = table.first[rows][pair_hyp] + (np.arange(n_pairs) - pair_start[pair_hyp])
    # Join candidate entries with reference entries of the same image and gram.
    hkeys = group_keys(rows[hyp.sentence], hyp.gram)
    lo = np.searchsorted(table.keys, hkeys, "left")
    hi = np.searchsorted(table.keys, hkeys, "right")
    span = hi - lo
    entry = np.repeat(np.arange(len(hkeys)), span)
    ref_pos = np.repeat(lo, span) + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    ref_w = table.weight[ref_pos]
    overlap = np.minimum(hyp_w[entry], ref_w) * ref_w
    hs = hyp.sentence[entry]
    pair = pair_start[hs] + (table.entry_sentence[ref_pos] - table.first[rows[hs]])
    val = np.bincount(pair * MAX_N + hyp.order[entry], weights=overlap, minlength=n_pairs * MAX_N)
    val = val.reshape(n_pairs, MAX_N)
    denom = hyp_norm[pair_hyp] * table.norms[pair_ref]
    val = np.where(denom != 0, val / np.where(denom != 0, denom, 1.0), val)
    delta = (_bigram_length(hyp.lengths)[pair_hyp] - table.lengths[pair_ref]).astype(np.float64)
    val = val * (np.e ** (-(delta ** 2) / (2 * sigma ** 2)))[:, None]
    per_hyp = np.zeros((n_hyp, MAX_N))
    np.add.at(per_hyp, pair_hyp, val)
    return per_hyp.mean(axis=1) / refs_per_hyp * 10.0


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    keys = np.sort(keys)
    return keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys


def _with_eos(sentences: Sequence[Sequence[str]], use_eos: bool) -> list[list[str]]:
    return [[*s, EOS_TOKEN] if use_eos else list(s) for s in sentences]


def corpus_cider(batch: EvalBatch, sigma: float = SIGMA) -> np.ndarray:
    """`cider`: per-item CIDEr-D with document frequencies from these references (pycocoevalcap Cider)."""
    ref_grams = batch.ref_grams
    # An n-gram counts once per image however many of its references hold it.
    doc_keys = _sorted_unique(group_keys(batch.ref_row[ref_grams.sentence], ref_grams.gram))
    counts = np.bincount(doc_keys % np.int64(1 << 34))
    grams = np.flatnonzero(counts)
    df = DocFreq.from_counts(grams, counts[grams].astype(np.float64), len(batch))
    table = build_ref_table(ref_grams, batch.n_refs, df)
    return score_candidates(table, batch.hyp_grams, np.arange(len(batch)), df, sigma)


class CiderD:
    """`cider_d`: training-corpus document frequencies; each image's references vectorised once.

    `use_eos` appends the EOS token to candidates and references, as the reference SCST
    codebase does; it is an explicit setting and is logged by the reward.
    """

    def __init__(self, df_table: Mapping[tuple[str, ...], float], n_docs: int,
                 references: Mapping[int, Sequence[Sequence[str]]], use_eos: bool = False, sigma: float = SIGMA):
        self.use_eos, self.sigma = use_eos, sigma
        self.index = NgramIndex()
        grams = list(df_table)
        ids = self.index.gram_ids(grams)
        counts = np.fromiter((df_table[g] for g in grams), dtype=np.float64, count=len(grams))
        self.df = DocFreq.from_counts(ids, counts, n_docs)
        self.row_of = {int(i): r for r, i in enumerate(references)}
        refs = list(references.values())
        if any(len(r) == 0 for r in refs):
            bad = next(i for i, r in references.items() if len(r) == 0)
            raise DataError(f"cider_d: image id {bad} has no references")
        n_refs = np.asarray([len(r) for r in refs], dtype=np.int64)
        ref_grams = self.index.count(_with_eos([s for r in refs for s in r], use_eos))
        self.table = build_ref_table(ref_grams, n_refs, self.df)

    @classmethod
    def from_counts(cls, df_table: Mapping[tuple[str, ...], float], n_docs: int,
                    references: Mapping[int, Sequence[Sequence[str]]], use_eos: bool = False,
                    sigma: float = SIGMA) -> CiderD:
        """The constructor, named for call sites that hold a counted df table."""
        return cls(df_table, n_docs, references, use_eos, sigma)

    def __call__(self, candidates: Sequence[Sequence[str]], image_ids: Sequence[int]) -> np.ndarray:
        try:
            rows = np.fromiter((self.row_of[int(i)] for i in image_ids), dtype=np.int64, count=len(image_ids))
        except KeyError as exc:
            raise DataError(f"cider_d: no references cached for image id {exc.args[0]}") from None
        hyp = self.index.count(_with_eos(candidates, self.use_eos))
        return score_candidates(self.table, hyp, rows, self.df, self.sigma)
