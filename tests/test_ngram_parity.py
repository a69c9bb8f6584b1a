"""Per-item parity with pycocoevalcap on real MS-COCO captions."""

from __future__ import annotations

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from plumbing.ptb import ptb_tokenize
from rewards.benchmarks.ngram import reference_cider_d
from rewards.suite import MetricSuite
from rewards.text import bleu as bleu_module
from rewards.text.batch import EvalBatch
from rewards.text.bleu import bleu
from rewards.text.cider import CiderD, corpus_cider
from rewards.text.cider_df import document_frequency
from rewards.text.meteor import meteor_unavailable_reason
from rewards.text.rouge import rouge_l
from tests.conftest import load_coco_1k, needs_coco_1k

TOL = 1e-6


@pytest.fixture(scope="module")
def coco():
    data = load_coco_1k()
    gts = {d["image_id"]: [ptb_tokenize(r) for r in d["refs"]] for d in data}
    res = {d["image_id"]: [ptb_tokenize(d["candidate"])] for d in data}
    batch = EvalBatch([res[i][0].split() for i in gts], [[r.split() for r in gts[i]] for i in gts])
    return data, gts, res, batch


@needs_coco_1k
def test_bleu_parity(coco):
    _, gts, res, batch = coco
    ref_corpus, ref_items = Bleu(4).compute_score(gts, res, verbose=0)
    corpus, items = bleu(batch)
    np.testing.assert_allclose(corpus, ref_corpus, atol=TOL, rtol=0)
    np.testing.assert_allclose(items, np.asarray(ref_items).T, atol=TOL, rtol=0)


@needs_coco_1k
def test_bleu_counts_only_what_can_match_and_equals_the_shared_counts_path(coco):
    _, gts, res, _ = coco
    fresh = EvalBatch([res[i][0].split() for i in gts], [[r.split() for r in gts[i]] for i in gts])
    direct = bleu_module._direct_matches(fresh)
    assert not fresh.has_counts  # the direct path never builds the shared counts
    shared = bleu_module._shared_matches(fresh)
    np.testing.assert_array_equal(direct, shared)
    assert direct[:, 3].sum() > 0 and (direct[:, 0] > 0).all()


def test_bleu_paths_agree_on_edge_cases():
    cases = EvalBatch([[], ["a"], ["a", "a", "a", "b"], ["x", "y"], ["a", "b", "c", "d", "e"]],
                      [[["a", "b"]], [[]], [["a", "a", "b"], ["a", "b", "a", "a"]], [["p", "q"]],
                       [["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"], ["e", "d"]]])
    direct = bleu_module._direct_matches(cases)
    np.testing.assert_array_equal(direct, bleu_module._shared_matches(cases))
    assert direct[2].tolist() == [4.0, 2.0, 1.0, 0.0]  # "a" clipped at 3 (the second reference), +1 "b"
    assert direct[3].sum() == 0


@needs_coco_1k
def test_rouge_and_cider_parity(coco):
    _, gts, res, batch = coco
    ref_corpus, ref_items = Rouge().compute_score(gts, res)
    ours = rouge_l([res[i][0] for i in gts], [gts[i] for i in gts])
    np.testing.assert_allclose(ours, ref_items, atol=TOL, rtol=0)
    assert abs(ours.mean() - ref_corpus) <= TOL
    ref_corpus, ref_items = Cider().compute_score(gts, res)
    ours = corpus_cider(batch)
    np.testing.assert_allclose(ours, ref_items, atol=TOL, rtol=0)
    assert abs(ours.mean() - ref_corpus) <= TOL


@needs_coco_1k
def test_cider_d_with_the_same_references_equals_cider(coco):
    _, gts, res, _ = coco
    refs = {i: [r.split() for r in gts[i]] for i in gts}
    df, n_docs = document_frequency(refs.values(), with_eos=False)
    scorer = CiderD.from_counts(df, n_docs, refs)
    _, ref_items = Cider().compute_score(gts, res)
    np.testing.assert_allclose(scorer([res[i][0].split() for i in gts], list(gts)), ref_items, atol=TOL, rtol=0)


@needs_coco_1k
def test_cider_d_reward_with_many_samples_per_image(coco):
    """K candidates per image, scored against cached references, equal the reference scorer."""
    _, gts, _, _ = coco
    ids = list(gts)[:40]
    refs = {i: [r.split() for r in gts[i]] for i in gts}
    df, n_docs = document_frequency(refs.values(), with_eos=False)
    scorer = CiderD.from_counts(df, n_docs, refs)
    cand_ids = [i for i in ids for _ in range(5)]
    cands = [gts[ids[(k * 7 + 3) % len(ids)]][k % 5] for k in range(len(cand_ids))]
    ours = scorer([c.split() for c in cands], cand_ids)
    ref = reference_cider_d(df, n_docs, cands, [gts[i] for i in cand_ids])
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


@needs_coco_1k
@pytest.mark.skipif(meteor_unavailable_reason() is not None, reason=str(meteor_unavailable_reason()))
def test_meteor_equals_pycocoevalcap(coco):
    from pycocoevalcap.meteor.meteor import Meteor as RefMeteor

    data, gts, res, _ = coco
    ids = list(gts)[:60]
    ref_corpus, ref_items = RefMeteor().compute_score({i: gts[i] for i in ids}, {i: res[i] for i in ids})
    with MetricSuite(["meteor"]) as suite:
        out = suite.score({d["image_id"]: d["candidate"] for d in data[:60]},
                          {d["image_id"]: d["refs"] for d in data[:60]})
    assert abs(out.corpus["meteor"] - ref_corpus) <= TOL
    np.testing.assert_allclose([out.per_item["meteor"][i] for i in ids], ref_items, atol=TOL, rtol=0)


def test_bleu_falls_back_to_the_shared_counts_when_4_grams_do_not_pack():
    words = [f"w{k}" for k in range(46_341)]  # (46,341 + 1) ** 4 > 2 ** 62
    batch = EvalBatch([words, ["w1", "w2"]], [[words[:10]], [["w1", "w2", "w3"]]])
    assert bleu_module._direct_matches(batch) is None
    _, items = bleu(batch)
    np.testing.assert_array_equal(bleu_module.clipped_matches(batch), bleu_module._shared_matches(batch))
    assert items[1, 1] > 0.5  # "w1 w2" matches its reference
