"""Property tests: any text scores without crashing, within range, equal to pycocoevalcap."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from rewards.suite import MetricSuite
from rewards.text.batch import EvalBatch
from rewards.text.bleu import bleu
from rewards.text.cider import corpus_cider
from rewards.text.ngrams import NgramIndex
from rewards.text.rouge import lcs_length, rouge_l

WORDS = st.sampled_from(["a", "dog", "cat", "on", "the", "red", "mat", "and", "b"])
SENTENCE = st.lists(WORDS, min_size=0, max_size=12)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def naive_lcs(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
    return table[-1][-1]


@FAST
@given(SENTENCE, SENTENCE)
def test_bit_parallel_lcs(a, b):
    assert lcs_length(a, b) == naive_lcs(a, b)


@FAST
@given(st.lists(SENTENCE, min_size=1, max_size=6))
def test_ngram_counts_match_a_counter(sentences):
    grams = NgramIndex().count(sentences)
    for k, sentence in enumerate(sentences):
        expected = Counter(tuple(sentence[i:i + n]) for n in range(1, 5) for i in range(len(sentence) - n + 1))
        rows = grams.sentence == k
        assert sorted(grams.count[rows].tolist()) == sorted(float(c) for c in expected.values())


@FAST
@given(st.lists(st.tuples(SENTENCE, st.lists(SENTENCE.filter(bool), min_size=1, max_size=4)), min_size=2, max_size=6))
def test_random_text_parity_with_pycocoevalcap(items):
    gts = {k: [" ".join(r) for r in refs] for k, (_, refs) in enumerate(items)}
    res = {k: [" ".join(c)] for k, (c, _) in enumerate(items)}
    batch = EvalBatch([c for c, _ in items], [refs for _, refs in items])
    _, ref_bleu = Bleu(4).compute_score(gts, res, verbose=0)
    np.testing.assert_allclose(bleu(batch)[1], np.asarray(ref_bleu).T, atol=1e-9)
    _, ref_rouge = Rouge().compute_score(gts, res)
    np.testing.assert_allclose(rouge_l([res[k][0] for k in gts], [gts[k] for k in gts]), ref_rouge, atol=1e-12)
    if any(c for c, _ in items):  # pycocoevalcap's Cider asserts on an all-empty corpus
        _, ref_cider = Cider().compute_score(gts, res)
        np.testing.assert_allclose(corpus_cider(batch), ref_cider, atol=1e-9)


NAMES = ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider", "mean_length", "repeat_2", "bad_ending"]


def suite_scores(candidate: str, refs: list[str]):
    suite = MetricSuite(NAMES)
    return suite.score({1: candidate, 2: "a dog on a mat"}, {1: refs, 2: ["a cat on a mat", "the dog"]})


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=60))
def test_any_unicode_caption_scores_within_range(text):
    out = suite_scores(text, ["a dog sits on the red mat", "the cat and the dog"])
    for name in ("bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l"):
        assert all(0.0 <= v <= 1.0 + 1e-12 for v in out.per_item[name].values()), name
    assert all(0.0 <= v <= 10.0 + 1e-9 for v in out.per_item["cider"].values())
    assert all(np.isfinite(v) for v in out.corpus.values())


def test_edge_captions():
    for text in ["", "!!! ... ,,, ;", " ".join(["dog"] * 500), "🐕 sur le tapis — ça va"]:
        out = suite_scores(text, ["a dog sits on the red mat"])
        assert out.per_item["rouge_l"][1] >= 0 and out.per_item["bleu_4"][1] >= 0
    empty = suite_scores("", ["a dog sits on the red mat"])
    assert empty.per_item["bleu_1"][1] == 0 and empty.per_item["cider"][1] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(WORDS, min_size=4, max_size=12))
def test_identical_candidate_gets_the_top_score(words):
    caption = " ".join(words)
    out = suite_scores(caption, [caption, caption, caption])
    for name in ("bleu_1", "bleu_2", "bleu_3", "bleu_4"):
        assert out.per_item[name][1] >= 1 - 1e-6, name
    assert out.per_item["rouge_l"][1] == 1.0
