"""`python -m rewards.bench {ngram,clip,lclip,text}`: speed and parity of the reward path.

ngram: BLEU-4 / ROUGE-L / CIDEr and the SCST CIDEr-D reward against pycocoevalcap on real COCO
captions; clip: the batched CLIP-family scorer against a naive one (and the noun parser); lclip:
parameters and encode throughput of a teacher CLIP and its L-CLIP student; text: the reward-model
recipes' text-tower step (forward and backward) on a world batch of captions and hard negatives,
shared prefixes run once against the plain length-grouped forward. Every measurement is repeated and
reported as a median; the last line printed is one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from features.clip_models.spec import WORLD_CLIP_ARCH
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import load_config, option
from plumbing.errors import DataError
from plumbing.timing import COCO_1K
from rewards.benchmarks.ngram import bench_corpus_metrics, bench_scst_cider_d, bench_tokenizer, load_coco_1k


@dataclass
class RewardsBenchConfig:
    which: Literal["ngram", "clip", "lclip", "text"] = option("ngram", help="the benchmark to run", positional=True)
    data: str = option(str(COCO_1K), help="coco_val_1k.json-style file")
    repeats: int = option(5, help="repeats per measurement (medians are reported)", at_least=1)
    arch: str | None = option(None, help="clip: open_clip architecture (default ViT-B-32); lclip: the teacher's, "
                              f"text: the model's (default {WORLD_CLIP_ARCH}, the world CLIP)")
    weights: str | None = option(None, help="clip/lclip/text: (teacher) weights file or hub tag (default: random "
                                 "init)")
    world: str = option("runs/demo/world", help="text: the offline world's folder (dataset.json, scenes.json)")
    student: str | None = option(None, help="lclip: the student checkpoint (default: an untrained student shaped "
                                 "by --student-config)")
    student_config: str = option("configs/reward_models/world_lclip.yaml", help="lclip without --student: the "
                                 "distill_lclip config whose student shape is timed, untrained")
    device: str = option("auto", help="clip: auto (the GPU when present), cpu or cuda")
    terms: str = option("clip_s,ref_clip_s,f_clip_s", help="clip: the terms scored together")
    precision: Literal["fp32", "auto", "fp16", "bf16"] = option(
        "fp32", help="clip: our scorer's precision (fp32 makes max_abs_diff a parity check)")


def run_ngram(cfg: RewardsBenchConfig) -> dict:
    gts, res = load_coco_1k(cfg.data)
    result = {"bench": "ngram", "images": len(gts), **bench_corpus_metrics(gts, res, cfg.repeats),
              "scst_cider_d": bench_scst_cider_d(gts, max(cfg.repeats, 9)), "ptb_tokenizer": bench_tokenizer(cfg.data)}
    for name, row in result.items():
        if isinstance(row, dict) and "ratio" in row:
            print(f"{name:14s} ours {row['ours_s'] * 1e3:8.2f} ms   pycocoevalcap {row['ref_s'] * 1e3:8.2f} ms   "
                  f"x{row['ratio']:.1f}   max|diff| {row.get('max_abs_diff', 0):.2e}")
    return result


def run_clip(cfg: RewardsBenchConfig) -> dict:
    from rewards.benchmarks.clip import bench_clip, bench_nouns

    try:
        data = json.loads(Path(cfg.data).read_text())
    except FileNotFoundError:
        raise DataError(f"{cfg.data}: benchmark data not found") from None
    terms = tuple(t.strip() for t in cfg.terms.split(",") if t.strip())
    row = bench_clip(data, cfg.arch or "ViT-B-32", cfg.weights, cfg.device, cfg.repeats, terms=terms,
                     precision=cfg.precision)
    nouns = bench_nouns(data) if "f_clip_s" in terms else {"nouns_per_s": None}
    print(f"clip family ({', '.join(row['terms'])}; {row['captions']} captions, {row['arch']} on {row['device']}): "
          f"ours {row['ours_s'] * 1e3:.1f} ms (warm {row['ours_warm_s'] * 1e3:.1f} ms)   naive "
          f"{row['naive_s'] * 1e3:.1f} ms   x{row['ratio']:.1f}   max|diff| {row['max_abs_diff']:.2e}")
    if nouns["nouns_per_s"] is not None:
        print(f"nouns: {nouns['nouns_per_s']:.0f} nouns/s ({nouns['captions_per_s']:.0f} captions/s)")
    return {"bench": "clip", **row, "nouns_per_s": nouns["nouns_per_s"], "nouns": nouns}


def run_lclip(cfg: RewardsBenchConfig) -> dict:
    from rewards.benchmarks.clip import bench_lclip
    from rewards.recipes.distill import DistillConfig

    shape = None if cfg.student else load_config(DistillConfig, cfg.student_config)
    row = bench_lclip(cfg.arch or WORLD_CLIP_ARCH, cfg.weights, cfg.student, cfg.repeats, shape=shape)
    print(f"teacher {row['teacher_params'] / 1e6:.2f}M params, {row['teacher_pairs_per_s']:.0f} pairs/s; "
          f"student {row['student_params'] / 1e6:.2f}M ({row['param_ratio']:.0%}), {row['student_pairs_per_s']:.0f} "
          f"pairs/s; speedup x{row['speedup']:.2f}")
    return {"bench": "lclip", **row}


def run_text(cfg: RewardsBenchConfig) -> dict:
    from rewards.benchmarks.text import bench_text

    row = bench_text(cfg.world, cfg.arch or WORLD_CLIP_ARCH, cfg.weights, cfg.repeats)
    print(f"text tower step ({row['texts']} texts, {row['tokens']} tokens, {row['tokens_run']} run once shared): "
          f"shared prefixes {row['ours_s'] * 1e3:.0f} ms   plain {row['ref_s'] * 1e3:.0f} ms   x{row['ratio']:.2f}   "
          f"max|diff| {row['max_abs_diff']:.2e}")
    tok = row["tokenizer"]
    print(f"tokenizer ({tok['texts']} texts, same ids as open_clip: {tok['same_ids']}): ours warm "
          f"{tok['ours_s'] * 1e3:.1f} ms (x{tok['ratio']:.1f}), cold {tok['cold_s'] * 1e3:.1f} ms "
          f"(x{tok['cold_ratio']:.1f})   open_clip {tok['ref_s'] * 1e3:.1f} ms")
    return {"bench": "text", **row}


RUNS = {"ngram": run_ngram, "clip": run_clip, "lclip": run_lclip, "text": run_text}


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(RewardsBenchConfig, "python -m rewards.bench", __doc__)
    cfg, _ = parse_config(RewardsBenchConfig, parser, argv)
    print(json.dumps(RUNS[cfg.which](cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
