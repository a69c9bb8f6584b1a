"""`python -m captioner.retrieval --config CONFIG [--split val]`: the caption-retrieval baseline.

Each image gets the first reference caption of its nearest training image by cosine similarity
of the pooled features (fc). Scored with the same metric suite as the captioner, so a trained
model can be compared with "copy the most similar training caption".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from captioner.data import Labels
from captioner.train_config import TrainConfig, scoring_context
from features.store import FeatureReader
from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option
from rewards import MetricSuite


def _normalised(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)


def retrieve(labels: Labels, feats: FeatureReader, refs: dict[int, list[str]], split: str) -> dict[int, str]:
    train_ids = labels.image_ids[labels.rows("train")].tolist()
    query_ids = labels.image_ids[labels.rows(split)].tolist()
    bank = _normalised(feats.get_many("fc", train_ids))
    captions = {}
    for start in range(0, len(query_ids), 512):
        chunk = query_ids[start:start + 512]
        nearest = (_normalised(feats.get_many("fc", chunk)) @ bank.T).argmax(axis=1)
        captions.update({q: refs[train_ids[n]][0] for q, n in zip(chunk, nearest, strict=True)})
    return captions


@dataclass
class RetrievalConfig(TrainConfig):
    """A training config (its data, metrics and reward models) plus what the baseline needs."""

    split: str = option("val", help="the split whose images get retrieved captions")
    out: str | None = option(None, help="write the retrieved captions (COCO results format)")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(RetrievalConfig, "python -m captioner.retrieval", __doc__)
    cfg, _ = parse_config(RetrievalConfig, parser, argv)
    context = scoring_context(cfg)
    refs = context.references
    captions = retrieve(Labels.load(cfg.data.labels), FeatureReader(cfg.data.feats), refs, cfg.split)
    if cfg.data.max_val_images and cfg.split == cfg.data.val_split:
        captions = dict(list(captions.items())[: cfg.data.max_val_images])
    with MetricSuite(cfg.eval.metrics, context) as suite:
        result = suite.score(captions, refs)
    if cfg.out:
        write_json(cfg.out, [{"image_id": i, "caption": c} for i, c in captions.items()])
    print(result.table())
    print(json.dumps({"baseline": "retrieval-fc-cosine", "split": cfg.split, **result.corpus}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
