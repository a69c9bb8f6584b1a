"""`python -m rewards.score --predictions results.json --references dataset.json [--config CFG]`

Scores a COCO results file with the metric suite. Writes, atomically, {"corpus": {metric: value},
"per_item": {metric: {image_id: value}}, "skipped": {metric: reason}} and prints a table.
CLIP-family metrics need reward models (`reward_models` in --config, e.g. configs/scoring_world.yaml).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys
from plumbing.errors import DataError
from plumbing.references import load_predictions, load_references
from rewards.context import ScoringContext, ScoringSettings
from rewards.suite import MetricSuite


@dataclass
class ScoreConfig(ScoringSettings):
    predictions: str = option("", help="COCO results file [{image_id, caption}]")
    references: str = option("", help="Karpathy dataset.json, COCO captions_*.json, or prepro's refs.json")
    split: str | None = option(None, help="Karpathy files: use only this split's references (train/val/test)")
    metrics: str = option("all", help="'all' or a comma list of metric names")
    out: str | None = option(None, help="scores JSON to write")
    require_all: bool = option(False, help="every image with references must have a prediction (else a warning)")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ScoreConfig, "python -m rewards.score", __doc__)
    cfg, _ = parse_config(ScoreConfig, parser, argv)
    require_keys(cfg, ("predictions", "references"), "score")
    predictions = load_predictions(cfg.predictions)
    references = load_references(cfg.references, cfg.split)
    missing = [i for i in predictions if i not in references]
    if missing:
        raise DataError(f"{cfg.predictions}: {len(missing)} prediction id(s) not in the references "
                        f"{cfg.references}{' split ' + cfg.split if cfg.split else ''}, e.g. {missing[:5]}")
    unscored = [i for i in references if i not in predictions]
    if unscored:
        message = (f"{len(unscored)} image(s) with references in {cfg.references} have no prediction in "
                   f"{cfg.predictions}, e.g. ids {unscored[:5]}")
        if cfg.require_all:
            raise DataError(message)
        print(f"warning: {message}; scoring the {len(predictions)} predicted (--require-all makes this an error)",
              file=sys.stderr)
    with MetricSuite(cfg.metrics, ScoringContext.from_settings(cfg, references)) as suite:
        result = suite.score(predictions, references)
    print(result.table())
    if cfg.out:
        write_json(cfg.out, result.to_json())
        print(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
