"""The n-gram benchmark: BLEU-4, ROUGE-L, CIDEr and the SCST CIDEr-D reward against
pycocoevalcap on the same tokenised captions in the same process, medians of repeats."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from plumbing.errors import DataError
from plumbing.ptb import ptb_tokenize
from plumbing.timing import comparison, median_seconds
from rewards.text.batch import EvalBatch
from rewards.text.bleu import bleu
from rewards.text.cider import CiderD, corpus_cider
from rewards.text.cider_df import document_frequency
from rewards.text.rouge import rouge_l


def load_coco_1k(path: str | Path) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """(tokenised references, tokenised candidate as a one-item list) by image id."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: benchmark data not found") from None
    gts = {d["image_id"]: [ptb_tokenize(r) for r in d["refs"]] for d in data}
    res = {d["image_id"]: [ptb_tokenize(d["candidate"])] for d in data}
    return gts, res


def _batch(gts: dict, res: dict) -> EvalBatch:
    return EvalBatch([res[i][0].split() for i in gts], [[r.split() for r in gts[i]] for i in gts])


def bench_corpus_metrics(gts: dict, res: dict, repeats: int) -> dict:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    out = {}
    ref_s, (_, ref_items) = median_seconds(lambda: Bleu(4).compute_score(gts, res, verbose=0), repeats)
    ours_s, (_, items) = median_seconds(lambda: bleu(_batch(gts, res)), repeats)
    out["bleu_4"] = comparison(ours_s, ref_s, max_abs_diff=float(np.abs(np.asarray(ref_items[3]) - items[:, 3]).max()))
    ref_s, (_, ref_items) = median_seconds(lambda: Rouge().compute_score(gts, res), repeats)
    ours_s, items = median_seconds(lambda: rouge_l([res[i][0] for i in gts], [gts[i] for i in gts]), repeats)
    out["rouge_l"] = comparison(ours_s, ref_s, max_abs_diff=float(np.abs(ref_items - items).max()))
    ref_s, (_, ref_items) = median_seconds(lambda: Cider().compute_score(gts, res), repeats)
    ours_s, items = median_seconds(lambda: corpus_cider(_batch(gts, res)), repeats)
    out["cider"] = comparison(ours_s, ref_s, max_abs_diff=float(np.abs(ref_items - items).max()))
    return out


class _DocCount(list):
    """A reference list whose len() is the training corpus size: pycocoevalcap's compute_cider
    sets ref_len = log(len(crefs)); this hands it the training N without touching its code."""

    def __init__(self, items: list, n_docs: int):
        super().__init__(items)
        self.n_docs = n_docs

    def __len__(self) -> int:
        return self.n_docs


def reference_cider_d(df: dict, n_docs: int, cands: list[str], refs: list[list[str]]) -> np.ndarray:
    """The reference SCST reward: pycocoevalcap's CiderScorer with the training df."""
    from collections import defaultdict

    from pycocoevalcap.cider.cider_scorer import CiderScorer

    scorer = CiderScorer(n=4, sigma=6.0)
    for cand, rs in zip(cands, refs, strict=True):
        scorer += (cand, rs)
    scorer.document_frequency = defaultdict(float, {k: float(v) for k, v in df.items()})
    scorer.crefs = _DocCount(scorer.crefs, n_docs)
    return np.asarray(scorer.compute_cider())


def bench_scst_cider_d(gts: dict, repeats: int, images: int = 50, k: int = 5, seed: int = 0) -> dict:
    ids = list(gts)
    refs_tokens = {i: [r.split() for r in gts[i]] for i in ids}
    df, n_docs = document_frequency(refs_tokens.values(), with_eos=False)
    scorer = CiderD.from_counts(df, n_docs, refs_tokens)
    rng = random.Random(seed)
    batch_ids = rng.sample(ids, images)
    pool = [(i, r) for i in ids for r in gts[i]]
    cand_ids, cands = [], []
    for image_id in batch_ids:  # candidates drawn from other images' captions
        others = [r for i, r in rng.sample(pool, 4 * k) if i != image_id][:k]
        cand_ids += [image_id] * k
        cands += others
    ours_s, ours = median_seconds(lambda: scorer([c.split() for c in cands], cand_ids), repeats)
    ref_s, ref = median_seconds(lambda: reference_cider_d(df, n_docs, cands, [gts[i] for i in cand_ids]), repeats)
    return comparison(ours_s, ref_s, max_abs_diff=float(np.abs(ours - ref).max()), candidates=len(cands))


def bench_tokenizer(path: str | Path) -> dict:
    from plumbing.ptb_java import java_available, java_ptb_tokenize

    data = json.loads(Path(path).read_text())
    texts = [t for d in data for t in [d["candidate"], *d["refs"]]]
    ours_s, ours = median_seconds(lambda: [ptb_tokenize(t) for t in texts], 3)
    if not java_available():
        return {"python_s": round(ours_s, 4), "java": "unavailable"}
    java_s, java = median_seconds(lambda: java_ptb_tokenize(texts), 1)
    same = sum(a == b for a, b in zip(ours, java, strict=True)) / len(texts)
    return {"captions": len(texts), "python_s": round(ours_s, 4), "java_s": round(java_s, 4), "identical_share": same}
