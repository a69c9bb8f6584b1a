"""Captions from a saved checkpoint: load the model with its config and vocabulary, decode a
split of the config's data, and score the captions with the metric suite."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.checkpoint import load_weights, read_checkpoint
from captioner.data import CaptionDataset, Labels, collate
from captioner.decoding import Constraints, DecodeConfig, decode
from captioner.model import Captioner
from captioner.train_config import TrainConfig, scoring_context
from captioner.vocab import Vocab
from plumbing.config import apply_overrides, build
from plumbing.device import pick_device
from plumbing.errors import DataError
from rewards import MetricSuite, SuiteResult


def load_captioner(checkpoint: str | Path, overrides: Sequence[str] = ()) -> tuple[Captioner, TrainConfig, Vocab]:
    """Model, resolved config (with overrides, e.g. data paths) and vocabulary of a checkpoint."""
    path = Path(checkpoint)
    state, saved_cfg, vocab = read_checkpoint(path)
    cfg = build(TrainConfig, apply_overrides(saved_cfg, overrides))
    model = Captioner(cfg.model, state.vocab_size, state.max_len, state.feat_dim, state.n_tokens, state.fc_dim)
    load_weights(model, path, "checkpoint")
    return model.eval(), cfg, vocab


@torch.no_grad()
def decode_dataset(model: Captioner, dataset: CaptionDataset, vocab: Vocab, opts: DecodeConfig, batch_size: int,
                   device: torch.device, progress: bool = True) -> dict[int, list[str]]:
    """Every image's captions (one, or sample_n) in the dataset's order."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    constraints = Constraints.of(opts, vocab)
    captions: dict[int, list[str]] = {}
    model.to(device)
    for batch in tqdm(loader, desc="decode", unit="batch", disable=not progress):
        att, fc, mask = (batch[k].to(device) for k in ("att", "fc", "att_mask"))
        texts = vocab.decode_batch(decode(model, att, fc, mask, opts, constraints).tokens)
        per_image = len(texts) // len(batch["image_ids"])
        for k, image_id in enumerate(batch["image_ids"].tolist()):
            captions[image_id] = texts[k * per_image: (k + 1) * per_image]
    return captions


def decode_for_config(model: Captioner, vocab: Vocab, cfg: TrainConfig, split: str, opts: DecodeConfig,
                      max_images: int = 0, where: str = "the checkpoint") -> dict[int, list[str]]:
    """Captions for `split` of the config's data (the first `max_images` images when > 0, as
    training's val pass takes them); the model's vocabulary must be the data's."""
    data_vocab = Vocab.load(cfg.data.vocab)
    if data_vocab != vocab:
        raise DataError(f"{where}: its vocabulary differs from {cfg.data.vocab}: {vocab.differences(data_vocab)}")
    dataset = CaptionDataset(Labels.load(cfg.data.labels), cfg.data.feats, split, 1)
    if max_images:
        dataset.rows = dataset.rows[:max_images]
    return decode_dataset(model, dataset, vocab, opts, cfg.eval.batch_size, pick_device("auto"))


def score_captions(captions: dict[int, str], cfg: TrainConfig, metrics: str | Sequence[str]) -> SuiteResult:
    """The metric suite on captions, with the config's references, CIDEr df, scenes and reward models."""
    context = scoring_context(cfg)
    with MetricSuite(metrics, context) as suite:
        return suite.score(captions, context.references)
