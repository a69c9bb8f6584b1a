"""`python -m captioner.retrieval --config CONFIG [--split val]`: the caption-retrieval baseline.

Each image gets the first reference caption of its nearest training image by cosine similarity
of the pooled features (fc). Scored with the same metric suite as the captioner, so a trained
model can be compared with "copy the most similar training caption".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np

from captioner.atomic import write_json
from captioner.cli import add_config_args, command
from captioner.config import load_config
from captioner.data import Labels
from captioner.train_config import TrainConfig, metric_context
from features.store import FeatureReader
from rewards.references import load_references
from rewards.score import format_table
from rewards.suite import MetricSuite


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


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m captioner.retrieval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--split", default="val")
    parser.add_argument("--out", help="write the retrieved captions (COCO results format)")
    args = parser.parse_args(argv)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    labels, refs = Labels.load(cfg.data.labels), load_references(cfg.data.refs)
    captions = retrieve(labels, FeatureReader(cfg.data.feats), refs, args.split)
    if cfg.data.max_val_images and args.split == cfg.data.val_split:
        captions = dict(list(captions.items())[: cfg.data.max_val_images])
    with MetricSuite(cfg.eval.metrics, metric_context(cfg)) as suite:
        result = suite.score(captions, refs)
    if args.out:
        write_json(args.out, [{"image_id": i, "caption": c} for i, c in captions.items()])
    print(format_table(result))
    print(json.dumps({"baseline": "retrieval-fc-cosine", "split": args.split, **result.corpus}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
