"""`python -m rewards.detail_units --dataset runs/demo/world/dataset.json --split val`

Segment a dataset's long captions into detail units with the SPECS grammar and its three rules;
where the dataset records units (the offline world does), print the precision and recall of the
split points against them. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys
from plumbing.errors import DataError
from plumbing.karpathy import load_dataset
from rewards.recipes.detail_units import DetailSegmenter, split_scores


@dataclass
class DetailUnitsConfig:
    dataset: str = option("", help="Karpathy-format dataset.json with long_captions")
    split: str = option("val", help="the split whose long captions are segmented")
    show: int = option(3, help="print this many segmented captions", at_least=0)


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(DetailUnitsConfig, "python -m rewards.detail_units", __doc__)
    cfg, _ = parse_config(DetailUnitsConfig, parser, argv)
    require_keys(cfg, ("dataset",), "detail_units")
    entries = [e for e in load_dataset(cfg.dataset) if e.split == cfg.split]
    captions = [c for e in entries for c in e.extra.get("long_captions", []) if isinstance(c, dict) and c.get("raw")]
    if not captions:
        raise DataError(f"{cfg.dataset}: no long captions in split {cfg.split!r}")
    predicted = DetailSegmenter()([c["raw"] for c in captions])
    for units in predicted[: cfg.show]:
        print(" | ".join(units))
    truth = [c.get("detail_units") for c in captions]
    scores = split_scores(predicted, truth) if all(isinstance(t, list) for t in truth) else {"captions": len(captions)}
    print(json.dumps({"dataset": cfg.dataset, "split": cfg.split, **scores}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
