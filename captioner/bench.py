"""`python -m captioner.bench [decode]`: decoding throughput, cached against uncached.

Greedy, sampling K=5 and beam 3 on B images, with the KV cache and with full recomputation of
the prefix at every step, for the reference-size Transformer (6+6 layers, d 512) on
bottom-up-like features. Captions run to 16 tokens. `cache_speedup` is the smallest speedup of
the decoding loop (the encoder pass, identical in both paths, is timed apart);
`end_to_end_speedup` includes it. Medians of repeats; the last line printed is one JSON object.

`scst`: one SCST step for B=50 images x K=5 samples split into sampling (with gradients),
reward (cider_d against real COCO references, training-corpus document frequencies) and
backward, for the reference-size model and the world's small model; `reward_share` is the
larger of the two reward shares.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from captioner.decoding import beam_search, greedy, sample
from captioner.model import Captioner, ModelConfig
from captioner.scst import loo_baseline
from captioner.vocab import Vocab
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option
from plumbing.ptb import ptb_tokenize
from plumbing.timing import COCO_1K, median_seconds
from rewards import RewardBank, ScoringContext, document_frequency, save_df


@dataclass
class DecodeBenchConfig:
    which: Literal["decode", "scst"] = option("decode", help="the benchmark to run", positional=True)
    images: int = option(50, help="images per batch", at_least=1)
    model: Literal["reference", "world"] = option("reference", help="decode: the model size")
    repeats: int = option(3, help="repeats per measurement (medians are reported)", at_least=1)


WORLD_MODEL = ModelConfig(d_model=192, n_heads=4, enc_layers=3, dec_layers=3, d_ff=512, visual_stem="linear")


def bench_decode(model_cfg: ModelConfig, images: int, tokens: int, feat_dim: int, vocab: int, max_len: int,
                 repeats: int) -> dict:
    torch.manual_seed(0)
    model = Captioner(model_cfg, vocab, max_len, feat_dim, tokens, feat_dim).eval()
    # A random model puts ~1/vocab on EOS, so nearly every caption runs all max_len steps (reported).
    att = torch.randn(images, tokens, feat_dim)
    fc, mask = att.mean(1), torch.ones(images, tokens, dtype=torch.bool)
    modes = {
        "greedy": (lambda cache: greedy(model, att, fc, mask, use_cache=cache), images),
        "sample_k5": (lambda cache: _sample(model, att, fc, mask, cache), images * 5),
        "beam3": (lambda cache: beam_search(model, att, fc, mask, 3, use_cache=cache), images),
    }
    with torch.no_grad():
        encode_s, _ = median_seconds(lambda: model.memory_kv(model.encode(att, fc, mask)[0]), repeats)
    result = {"encode_s": round(encode_s, 4)}
    for name, (fn, n_captions) in modes.items():
        row = {}
        for cache in (True, False):
            seconds, out = median_seconds(lambda fn=fn, cache=cache: fn(cache), repeats)
            key = "cached" if cache else "uncached"
            row[f"{key}_captions_per_s"] = round(n_captions / seconds, 1)
            row[f"{key}_s"] = round(seconds, 4)
            row["mean_tokens"] = round(float(out.lengths.float().mean()), 2)
        row["end_to_end_speedup"] = round(row["uncached_s"] / row["cached_s"], 2)
        # Both paths share one encoder pass; the cache only changes the decoding loop.
        row["decode_loop_speedup"] = round((row["uncached_s"] - encode_s) / (row["cached_s"] - encode_s), 2)
        result[name] = row
    return result


def bench_scst(model_cfg: ModelConfig, images: int, tokens: int, feat_dim: int, repeats: int, k: int = 5) -> dict:
    import time

    data = json.loads(COCO_1K.read_text())
    refs = {d["image_id"]: d["refs"] for d in data}
    words = sorted({w for rs in refs.values() for r in rs for w in ptb_tokenize(r).split()})
    vocab = Vocab({str(i + 1): w for i, w in enumerate(words)})
    with tempfile.TemporaryDirectory() as tmp:
        df_path = Path(tmp) / "df.json.gz"
        df, n_docs = document_frequency([[ptb_tokenize(r).split() for r in rs] for rs in refs.values()])
        save_df(df_path, df, n_docs, "ptb-python")
        bank = RewardBank.from_config({"cider_d": 1.0}, ScoringContext(references=refs, cider_df=str(df_path)))
    torch.manual_seed(0)
    model = Captioner(model_cfg, len(vocab), 16, feat_dim, tokens, feat_dim).train()
    ids = torch.tensor(list(refs)[:images])
    att = torch.randn(images, tokens, feat_dim)
    fc, mask = att.mean(1), torch.ones(images, tokens, dtype=torch.bool)
    times = {"sampling_s": [], "reward_s": [], "backward_s": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model(att, fc, mask, sample_k=k)
        t1 = time.perf_counter()
        scored = bank(vocab.decode_batch(out.tokens), ids.repeat_interleave(k).tolist())
        t2 = time.perf_counter()
        advantage = scored.total - loo_baseline(scored.total, k)
        alive = torch.cat([torch.ones_like(out.tokens[:, :1], dtype=torch.bool), out.tokens[:, :-1] > 0], 1)
        loss = -(advantage[:, None] * out.logprobs * alive).sum() / alive.sum()
        model.zero_grad()
        loss.backward()
        t3 = time.perf_counter()
        for key, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[key].append(seconds)
    row = {key: round(statistics.median(values), 4) for key, values in times.items()}
    row["step_s"] = round(sum(row.values()), 4)
    row["reward_share"] = round(row["reward_s"] / row["step_s"], 4)
    row["mean_tokens"] = round(float(out.lengths.float().mean()), 2)
    return row


def _sample(model, att, fc, mask, cache):
    with torch.no_grad():
        return sample(model, att, fc, mask, k=5, use_cache=cache)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(DecodeBenchConfig, "python -m captioner.bench", __doc__)
    args, _ = parse_config(DecodeBenchConfig, parser, argv)
    if args.which == "scst":
        rows = {"reference": bench_scst(ModelConfig(), args.images, 49, 2048, args.repeats),
                "world": bench_scst(WORLD_MODEL, args.images, 64, 192, args.repeats)}
        for name, row in rows.items():
            print(f"{name:10s} sampling {row['sampling_s']:.3f}s  reward {row['reward_s']:.4f}s  "
                  f"backward {row['backward_s']:.3f}s  reward share {row['reward_share']:.3f}")
        print(json.dumps({"bench": "scst", "images": args.images, "k": 5, "reward": "cider_d", **rows,
                          "reward_share": max(row["reward_share"] for row in rows.values())}))
        return 0
    model_cfg = ModelConfig() if args.model == "reference" else WORLD_MODEL
    feat_dim, tokens, vocab = (2048, 49, 9487) if args.model == "reference" else (192, 64, 80)
    rows = bench_decode(model_cfg, args.images, tokens, feat_dim, vocab, 16, args.repeats)
    modes = {name: row for name, row in rows.items() if isinstance(row, dict)}
    for name, row in modes.items():
        print(f"{name:10s} cached {row['cached_captions_per_s']:8.1f}/s  "
              f"uncached {row['uncached_captions_per_s']:8.1f}/s"
              f"  end-to-end x{row['end_to_end_speedup']:.2f}  decoding loop x{row['decode_loop_speedup']:.2f}"
              f"  ({row['mean_tokens']} tokens)")
    print(f"encoder pass (shared by both paths): {rows['encode_s']:.3f}s")
    print(json.dumps({"bench": "decode", "model": args.model, "images": args.images, "max_len": 16, **rows,
                      "cache_speedup": min(row["decode_loop_speedup"] for row in modes.values()),
                      "end_to_end_speedup": min(row["end_to_end_speedup"] for row in modes.values())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
