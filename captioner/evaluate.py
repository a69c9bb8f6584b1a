"""`python -m captioner.evaluate --checkpoint DIR --split test [--beam 3] --out results.json`

Decodes a split with a checkpoint's weights, writes COCO-format results (atomically), scores
them with the metric suite and writes the scores next to the results.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_model
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.atomic import write_json
from captioner.checkpoint import read_checkpoint
from captioner.cli import command
from captioner.config import apply_overrides, build
from captioner.data import CaptionDataset, Labels, collate
from captioner.decoding import beam_search, greedy
from captioner.device import pick_device
from captioner.errors import DataError
from captioner.model import Captioner
from captioner.train_config import TrainConfig, metric_context
from captioner.vocab import Vocab
from rewards.references import load_references
from rewards.score import format_table
from rewards.suite import MetricSuite, SuiteResult


def load_captioner(checkpoint: str | Path, overrides: Sequence[str] = ()) -> tuple[Captioner, TrainConfig, Vocab]:
    """Model, resolved config (with overrides, e.g. data paths) and vocabulary of a checkpoint."""
    path = Path(checkpoint)
    state, saved_cfg, vocab = read_checkpoint(path)
    cfg = build(TrainConfig, apply_overrides(saved_cfg, overrides))
    model = Captioner(cfg.model, state.vocab_size, state.max_len, state.feat_dim, state.n_tokens, state.fc_dim)
    weights = path / "model.safetensors"
    if not weights.exists():
        raise DataError(f"{path}: no model.safetensors")
    load_model(model, str(weights))
    return model.eval(), cfg, vocab


@torch.no_grad()
def decode_dataset(model: Captioner, dataset: CaptionDataset, vocab: Vocab, beam: int, batch_size: int,
                   device: torch.device, progress: bool = True) -> dict[int, str]:
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    captions: dict[int, str] = {}
    model.to(device)
    for batch in tqdm(loader, desc="decode", unit="batch", disable=not progress):
        att, fc, mask = (batch[k].to(device) for k in ("att", "fc", "att_mask"))
        out = beam_search(model, att, fc, mask, beam) if beam > 1 else greedy(model, att, fc, mask)
        captions.update(zip(batch["image_ids"].tolist(), vocab.decode_batch(out.tokens), strict=True))
    return captions


def decode_for_config(model: Captioner, vocab: Vocab, cfg: TrainConfig, split: str, beam: int,
                      max_images: int = 0, where: str = "the checkpoint") -> dict[int, str]:
    """Captions for `split` of the config's data (the first `max_images` images when > 0, as
    training's val pass takes them); the model's vocabulary must be the data's."""
    data_vocab = Vocab.load(cfg.data.vocab)
    if data_vocab != vocab:
        raise DataError(f"{where}: its vocabulary differs from {cfg.data.vocab}: {vocab.differences(data_vocab)}")
    dataset = CaptionDataset(Labels.load(cfg.data.labels), cfg.data.feats, split, 1)
    if max_images:
        dataset.rows = dataset.rows[:max_images]
    return decode_dataset(model, dataset, vocab, beam, cfg.eval.batch_size, pick_device("auto"))


def score_captions(captions: dict[int, str], cfg: TrainConfig, metrics: str | Sequence[str]) -> SuiteResult:
    """The metric suite on captions, with the config's references, CIDEr df, scenes and reward models."""
    with MetricSuite(metrics, metric_context(cfg)) as suite:
        return suite.score(captions, load_references(cfg.data.refs))


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioner.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint directory, e.g. runs/x/checkpoints/best")
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    parser.add_argument("--out", required=True, help="results JSON (COCO results format)")
    parser.add_argument("--metrics", help="comma list (default: the run's eval.metrics)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override the run's config, e.g. --set data.feats=other/feats.h5")
    args = parser.parse_args(argv)
    model, cfg, vocab = load_captioner(args.checkpoint, args.overrides)
    captions = decode_for_config(model, vocab, cfg, args.split, args.beam, where=args.checkpoint)
    write_json(args.out, [{"image_id": i, "caption": c} for i, c in sorted(captions.items())])
    result = score_captions(captions, cfg, args.metrics or cfg.eval.metrics)
    scores_path = Path(args.out).with_suffix(".scores.json")
    write_json(scores_path, result.to_json())
    print(format_table(result))
    print(f"wrote {args.out} and {scores_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
