"""`python -m captioner.bench [decode]`: decoding throughput, cached against uncached.

Greedy, sampling K=5 and beam 3 on B images, with the KV cache and with full recomputation of
the prefix at every step, for the reference-size Transformer (6+6 layers, d 512) on
bottom-up-like features. Captions run to 16 tokens. `cache_speedup` is the smallest speedup of
the decoding loop (the encoder pass, identical in both paths, is timed apart);
`end_to_end_speedup` includes it. Medians of repeats; the last line printed is one JSON object.

`scst`: one SCST step (the trainer's own step) for B=50 images x K=5 samples, for the reference-size
model and the world's small model: step time, reward time and `reward_share` (the larger of the
two), the step with the KL term to a frozen reference policy (`kl_overhead`) and the peak memory
(the GPU's allocator, or the process's resident set on a CPU). The rewards are cider_d on real COCO
references, or any mix with `--rewards cider_d,specs,f_clip_s --scoring configs/scoring_world.yaml
--references runs/demo/data/refs.json` (the world's reward models; the COCO rehearsal's at their real
sizes: `--scoring runs/coco_rehearsal/scoring.yaml`).

`xe`: one cross-entropy step of the reference-size model (10 images x 5 captions, as configs/coco/xe.yaml
trains) with its AdamW update: step time and peak memory. `--device` picks where every bench runs.
"""

from __future__ import annotations

import copy
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from captioner.decoding import beam_search, greedy, sample
from captioner.model import Captioner, ModelConfig
from captioner.scst import ScstConfig, scst_step
from captioner.vocab import Vocab
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import load_config, option
from plumbing.device import pick_device
from plumbing.errors import ConfigError
from plumbing.ptb import ptb_tokenize
from plumbing.timing import COCO_1K, median_seconds
from rewards import RewardBank, ScoringContext, ScoringSettings, document_frequency, load_references, save_df


@dataclass
class DecodeBenchConfig:
    which: Literal["decode", "scst", "xe"] = option("decode", help="the benchmark to run", positional=True)
    images: int = option(50, help="images per batch", at_least=1)
    model: Literal["reference", "world"] = option("reference", help="decode: the model size")
    repeats: int = option(3, help="repeats per measurement (medians are reported)", at_least=1)
    rewards: str = option("cider_d", help="scst: the reward mix, equal weights (CLIP-family terms need --scoring)")
    scoring: str | None = option(None, help="scst: a scoring config naming the reward models and cider_df "
                                 "(e.g. configs/scoring_world.yaml); without it, cider_d on COCO 1k")
    references: str | None = option(None, help="scst with --scoring: references by image id (e.g. refs.json)")
    vocab: str | None = option(None, help="scst with --scoring: the captioner's vocab.json (default: the "
                               "references' words)")
    data: str = option(str(COCO_1K), help="scst without --scoring: a coco_val_1k.json-style file of references")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")


CPU = torch.device("cpu")
WORLD_MODEL = ModelConfig(d_model=192, n_heads=4, enc_layers=3, dec_layers=3, d_ff=512, visual_stem="linear")


def bench_decode(model_cfg: ModelConfig, images: int, tokens: int, feat_dim: int, vocab: int, max_len: int,
                 repeats: int, device: torch.device = CPU) -> dict:
    torch.manual_seed(0)
    model = Captioner(model_cfg, vocab, max_len, feat_dim, tokens, feat_dim).to(device).eval()
    # A random model puts ~1/vocab on EOS, so nearly every caption runs all max_len steps (reported).
    att = torch.randn(images, tokens, feat_dim, device=device)
    fc, mask = att.mean(1), torch.ones(images, tokens, dtype=torch.bool, device=device)
    modes = {
        "greedy": (lambda cache: greedy(model, att, fc, mask, use_cache=cache), images),
        "sample_k5": (lambda cache: _sample(model, att, fc, mask, cache), images * 5),
        "beam3": (lambda cache: beam_search(model, att, fc, mask, 3, use_cache=cache), images),
    }
    with torch.no_grad():
        encode_s, _ = median_seconds(lambda: synchronized(model.memory_kv(model.encode(att, fc, mask)[0]), device),
                                     repeats)
    result = {"encode_s": round(encode_s, 4)}
    for name, (fn, n_captions) in modes.items():
        row = {}
        for cache in (True, False):
            seconds, out = median_seconds(lambda fn=fn, cache=cache: synchronized(fn(cache), device), repeats)
            key = "cached" if cache else "uncached"
            row[f"{key}_captions_per_s"] = round(n_captions / seconds, 1)
            row[f"{key}_s"] = round(seconds, 4)
            row["mean_tokens"] = round(float(out.lengths.float().mean()), 2)
        row["end_to_end_speedup"] = round(row["uncached_s"] / row["cached_s"], 2)
        # Both paths share one encoder pass; the cache only changes the decoding loop.
        row["decode_loop_speedup"] = round((row["uncached_s"] - encode_s) / (row["cached_s"] - encode_s), 2)
        result[name] = row
    return result


@dataclass
class RewardSetup:
    """What one SCST bench samples against: a vocabulary, reference captions by image id and a bank."""

    vocab: Vocab
    image_ids: list[int]
    bank: RewardBank
    name: str


def coco_cider_setup(tmp: Path, path: str | Path = COCO_1K) -> RewardSetup:
    """cider_d on real COCO references with their own document frequencies."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: COCO references for the SCST bench not found (--data)") from None
    refs = {d["image_id"]: d["refs"] for d in data}
    tokenized = [[ptb_tokenize(r).split() for r in rs] for rs in refs.values()]
    df_path = tmp / "df.json.gz"
    save_df(df_path, *document_frequency(tokenized), "ptb-python")
    bank = RewardBank.from_config({"cider_d": 1.0}, ScoringContext(references=refs, cider_df=str(df_path)))
    return RewardSetup(_vocab_of(tokenized), list(refs), bank, "cider_d (COCO 1k)")


def scoring_setup(cfg: DecodeBenchConfig) -> RewardSetup:
    """The `rewards` mix (equal weights) with the reward models of a scoring config (e.g. the world's),
    on the images those models have embeddings for."""
    from features.store import FeatureReader

    settings = load_config(ScoringSettings, cfg.scoring)
    refs = load_references(cfg.references)
    names = [n.strip() for n in cfg.rewards.split(",") if n.strip()]
    context = ScoringContext.from_settings(settings, refs)
    ids = [i for i in refs]
    for spec in settings.reward_models.values():
        have = FeatureReader(spec.embeds).row_of
        ids = [i for i in ids if i in have]
    if len(ids) < cfg.images:
        raise ConfigError(f"only {len(ids)} images have references and every embeds file; the bench needs {cfg.images}")
    bank = RewardBank.from_config({n: 1.0 / len(names) for n in names}, context)
    vocab = Vocab.load(cfg.vocab) if cfg.vocab else _vocab_of([[ptb_tokenize(r).split() for r in rs]
                                                                for rs in refs.values()])
    return RewardSetup(vocab, ids, bank, " + ".join(names))


def _vocab_of(tokenized: list[list[list[str]]]) -> Vocab:
    """A vocabulary of every word in tokenised reference lists."""
    words = sorted({w for refs in tokenized for ref in refs for w in ref})
    return Vocab({str(i + 1): w for i, w in enumerate(words)})


def bench_scst(model_cfg: ModelConfig, setup: RewardSetup, images: int, tokens: int, feat_dim: int, repeats: int,
               k: int = 5, device: torch.device = CPU) -> dict:
    """One SCST step (the trainer's scst_step) split into reward scoring and the rest, without and
    with the KL term to a frozen copy of the policy (the reference pass it adds)."""
    torch.manual_seed(0)
    model = Captioner(model_cfg, len(setup.vocab), 16, feat_dim, tokens, feat_dim).to(device).train()
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    att = torch.randn(images, tokens, feat_dim, device=device)
    batch = {"att": att, "fc": att.mean(1), "att_mask": torch.ones(images, tokens, dtype=torch.bool, device=device),
             "image_ids": torch.tensor(setup.image_ids[:images])}
    row = {}
    reset_peak(device)
    for label, kl in (("", 0.0), ("kl_", 0.1)):
        cfg = ScstConfig(k=k, kl_coef=kl)
        steps, rewards = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            step = scst_step(model, model, batch, setup.bank, setup.vocab, cfg, reference if kl else None)
            model.zero_grad()
            step.loss.backward()
            synchronize(device)
            steps.append(time.perf_counter() - start)
            rewards.append(sum(step.rewards.seconds.values()))
        row[f"{label}step_s"] = round(statistics.median(steps), 4)
        row[f"{label}reward_s"] = round(statistics.median(rewards), 4)
    row["reward_share"] = round(row["reward_s"] / row["step_s"], 4)
    row["kl_overhead"] = round(row["kl_step_s"] / row["step_s"] - 1, 4)
    row["images_per_s"] = round(images / row["step_s"], 2)
    row["mean_tokens"] = round(float(step.lengths.float().mean()), 2)
    row["peak_mb"] = peak_mb(device)
    return row


def bench_xe(model_cfg: ModelConfig, images: int, seq_per_img: int, tokens: int, feat_dim: int, vocab: int,
             repeats: int, device: torch.device) -> dict:
    """One XE step with its AdamW update: images x seq_per_img captions of 16 tokens."""
    from captioner.losses import caption_loss
    from plumbing.optim import adamw

    torch.manual_seed(0)
    model = Captioner(model_cfg, vocab, 16, feat_dim, tokens, feat_dim).to(device).train()
    optimizer = adamw(model.parameters(), lr=1e-4)
    att = torch.randn(images, tokens, feat_dim, device=device)  # encoded once per image, as the trainer does
    mask = torch.ones(images, tokens, dtype=torch.bool, device=device)
    labels = torch.randint(1, vocab, (images, seq_per_img, 16), device=device)

    def step() -> None:
        loss = caption_loss(model(att, att.mean(1), mask, labels), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        synchronize(device)

    step()  # the optimizer's state is made on the first step
    reset_peak(device)
    seconds, _ = median_seconds(step, repeats)
    return {"step_s": round(seconds, 4), "images_per_s": round(images / seconds, 2), "peak_mb": peak_mb(device),
            "parameters": sum(p.numel() for p in model.parameters())}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronized(result: object, device: torch.device) -> object:
    """`result`, once the GPU's queued work is done (a timed call must not end before its kernels)."""
    synchronize(device)
    return result


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float:
    """The GPU allocator's peak since the last reset, or this process's peak resident set on a CPU."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _sample(model, att, fc, mask, cache):
    with torch.no_grad():
        return sample(model, att, fc, mask, k=5, use_cache=cache)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(DecodeBenchConfig, "python -m captioner.bench", __doc__)
    args, _ = parse_config(DecodeBenchConfig, parser, argv)
    device = pick_device(args.device)
    if args.which == "xe":
        row = bench_xe(ModelConfig(), 10, 5, 49, 2048, 9487, args.repeats, device)
        print(f"reference XE step {row['step_s']:.3f}s  {row['images_per_s']:.1f} images/s  peak {row['peak_mb']} MB  "
              f"({row['parameters']:,} parameters, {device.type})")
        print(json.dumps({"bench": "xe", "device": device.type, "images": 10, "captions_per_image": 5, **row}))
        return 0
    if args.which == "scst":
        with tempfile.TemporaryDirectory() as tmp:
            setup = scoring_setup(args) if args.scoring else coco_cider_setup(Path(tmp), args.data)
            rows = {"reference": bench_scst(ModelConfig(), setup, args.images, 49, 2048, args.repeats, device=device),
                    "world": bench_scst(WORLD_MODEL, setup, args.images, 64, 192, args.repeats, device=device)}
        for name, row in rows.items():
            print(f"{name:10s} step {row['step_s']:.3f}s  reward {row['reward_s']:.4f}s  reward share "
                  f"{row['reward_share']:.3f}  with KL {row['kl_step_s']:.3f}s (+{row['kl_overhead']:.1%})  "
                  f"{row['images_per_s']:.1f} images/s  peak {row['peak_mb']} MB")
        print(json.dumps({"bench": "scst", "device": device.type, "images": args.images, "k": 5,
                          "rewards": setup.name, **rows,
                          "reward_share": max(row["reward_share"] for row in rows.values()),
                          "kl_overhead": max(row["kl_overhead"] for row in rows.values())}))
        return 0
    model_cfg = ModelConfig() if args.model == "reference" else WORLD_MODEL
    feat_dim, tokens, vocab = (2048, 49, 9487) if args.model == "reference" else (192, 64, 80)
    rows = bench_decode(model_cfg, args.images, tokens, feat_dim, vocab, 16, args.repeats, device)
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
