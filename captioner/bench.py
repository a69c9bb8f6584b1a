"""`python -m captioner.bench [decode]`: decoding throughput, cached against uncached.

Greedy, sampling K=5 and beam 3 on B images, with the KV cache and with full recomputation of
the prefix at every step, for the reference-size Transformer (6+6 layers, d 512) on
bottom-up-like features. Captions run to 16 tokens. Medians of repeats; the last line printed
is one JSON object. (`scst` is added by the SCST stage.)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch

from captioner.cli import command
from captioner.decoding import beam_search, greedy, sample
from captioner.model import Captioner, ModelConfig
from captioner.timing import median_seconds

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
    result = {}
    for name, (fn, n_captions) in modes.items():
        row = {}
        for cache in (True, False):
            seconds, out = median_seconds(lambda fn=fn, cache=cache: fn(cache), repeats)
            key = "cached" if cache else "uncached"
            row[f"{key}_captions_per_s"] = round(n_captions / seconds, 1)
            row[f"{key}_s"] = round(seconds, 4)
            row["mean_tokens"] = round(float(out.lengths.float().mean()), 2)
        row["speedup"] = round(row["uncached_s"] / row["cached_s"], 2)
        result[name] = row
    return result


def _sample(model, att, fc, mask, cache):
    with torch.no_grad():
        return sample(model, att, fc, mask, k=5, use_cache=cache)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioner.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="decode", choices=["decode"])
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--model", choices=["reference", "world"], default="reference")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model_cfg = ModelConfig() if args.model == "reference" else WORLD_MODEL
    feat_dim, tokens, vocab = (2048, 49, 9487) if args.model == "reference" else (192, 64, 80)
    rows = bench_decode(model_cfg, args.images, tokens, feat_dim, vocab, 16, args.repeats)
    for name, row in rows.items():
        print(f"{name:10s} cached {row['cached_captions_per_s']:8.1f}/s  uncached {row['uncached_captions_per_s']:8.1f}/s"
              f"  x{row['speedup']:.2f}  ({row['mean_tokens']} tokens)")
    speedup = min(row["speedup"] for row in rows.values())
    print(json.dumps({"bench": "decode", "model": args.model, "images": args.images, "max_len": 16, **rows,
                      "cache_speedup": speedup}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
