"""`python -m rewards.bench ngram`: speed and parity of the n-gram metrics against pycocoevalcap.

Runs pycocoevalcap on the same tokenised captions in the same process, repeats every
measurement and reports medians. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from captioner.cli import command
from captioner.errors import DataError
from captioner.timing import comparison, median_seconds
from rewards.batch import EvalBatch
from rewards.bleu import bleu
from rewards.cider import CiderD, corpus_cider
from rewards.cider_df import document_frequency
from rewards.ptb import ptb_tokenize
from rewards.rouge import rouge_l

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco_val_1k.json"


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
    from rewards.ptb_java import java_available, java_ptb_tokenize

    data = json.loads(Path(path).read_text())
    texts = [t for d in data for t in [d["candidate"], *d["refs"]]]
    ours_s, ours = median_seconds(lambda: [ptb_tokenize(t) for t in texts], 3)
    if not java_available():
        return {"python_s": round(ours_s, 4), "java": "unavailable"}
    java_s, java = median_seconds(lambda: java_ptb_tokenize(texts), 1)
    same = sum(a == b for a, b in zip(ours, java, strict=True)) / len(texts)
    return {"captions": len(texts), "python_s": round(ours_s, 4), "java_s": round(java_s, 4), "identical_share": same}


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["ngram", "clip", "lclip"],
                        help="ngram: BLEU/ROUGE-L/CIDEr and the SCST CIDEr-D reward; "
                        "clip: the batched CLIP-family scorer against a naive one, and the noun parser; "
                        "lclip: parameters and encode throughput of a teacher CLIP and its L-CLIP student")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="coco_val_1k.json-style file")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--arch", help="clip: open_clip architecture (default ViT-B-32); lclip: the teacher's "
                        "(default world-clip-tiny)")
    parser.add_argument("--weights", help="clip/lclip: (teacher) weights file or hub tag (default: random init)")
    parser.add_argument("--student", help="lclip: the student checkpoint (default: an untrained default student)")
    parser.add_argument("--device", default="auto", help="clip: auto (GPU when present), cpu or cuda")
    parser.add_argument("--terms", default="clip_s,ref_clip_s,f_clip_s", help="clip: the terms scored together")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "auto", "fp16", "bf16"],
                        help="clip: our scorer's precision (fp32 makes max_abs_diff a parity check)")
    args = parser.parse_args(argv)
    if args.which == "clip":
        return _main_clip(args)
    if args.which == "lclip":
        return _main_lclip(args)
    gts, res = load_coco_1k(args.data)
    result = {"bench": "ngram", "images": len(gts), **bench_corpus_metrics(gts, res, args.repeats),
              "scst_cider_d": bench_scst_cider_d(gts, max(args.repeats, 9)), "ptb_tokenizer": bench_tokenizer(args.data)}
    for name, row in result.items():
        if isinstance(row, dict) and "ratio" in row:
            print(f"{name:14s} ours {row['ours_s'] * 1e3:8.2f} ms   pycocoevalcap {row['ref_s'] * 1e3:8.2f} ms   "
                  f"x{row['ratio']:.1f}   max|diff| {row.get('max_abs_diff', 0):.2e}")
    print(json.dumps(result))
    return 0


def _main_clip(args: argparse.Namespace) -> int:
    from rewards.bench_clip import bench_clip, bench_nouns

    try:
        data = json.loads(Path(args.data).read_text())
    except FileNotFoundError:
        raise DataError(f"{args.data}: benchmark data not found") from None
    terms = tuple(t.strip() for t in args.terms.split(",") if t.strip())
    row = bench_clip(data, args.arch or "ViT-B-32", args.weights, args.device, args.repeats, terms=terms, precision=args.precision)
    nouns = bench_nouns(data) if "f_clip_s" in terms else {"nouns_per_s": None}
    print(f"clip family ({', '.join(row['terms'])}; {row['captions']} captions, {row['arch']} on {row['device']}): "
          f"ours {row['ours_s'] * 1e3:.1f} ms (warm {row['ours_warm_s'] * 1e3:.1f} ms)   naive "
          f"{row['naive_s'] * 1e3:.1f} ms   x{row['ratio']:.1f}   max|diff| {row['max_abs_diff']:.2e}")
    if nouns["nouns_per_s"] is not None:
        print(f"nouns: {nouns['nouns_per_s']:.0f} nouns/s ({nouns['captions_per_s']:.0f} captions/s)")
    print(json.dumps({"bench": "clip", **row, "nouns_per_s": nouns["nouns_per_s"], "nouns": nouns}))
    return 0


def _main_lclip(args: argparse.Namespace) -> int:
    from rewards.bench_clip import bench_lclip

    row = bench_lclip(args.arch or "world-clip-tiny", args.weights, args.student, args.repeats)
    print(f"teacher {row['teacher_params'] / 1e6:.2f}M params, {row['teacher_pairs_per_s']:.0f} pairs/s; "
          f"student {row['student_params'] / 1e6:.2f}M ({row['param_ratio']:.0%}), {row['student_pairs_per_s']:.0f} "
          f"pairs/s; speedup x{row['speedup']:.2f}")
    print(json.dumps({"bench": "lclip", **row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
