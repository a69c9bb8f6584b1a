"""`python -m rewards.specificity --weights spec.pt --dataset dataset.json --images-root DIR`

Specificity rates (SPECS Eqs. 1-2) of a reward model on the long captions of a dataset split whose
images carry detail units: SR_pos (adding a true detail raises the image-text similarity), SR_neg
(adding a detail of another image lowers it) and their average. The last line is one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from features.clip_models.factory import load_reward_model
from features.clip_models.spec import WORLD_CLIP_ARCH, RewardModelSpec
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys
from plumbing.device import pick_device
from rewards.recipes.specificity import evaluate_specificity


@dataclass
class SpecificityConfig:
    kind: Literal["open_clip", "longclip", "lclip"] = option("longclip", help="reward-model kind of --weights")
    weights: str = option("", help="checkpoint file (or a hub tag for open_clip)")
    arch: str = option(WORLD_CLIP_ARCH, help="open_clip architecture (kind open_clip; default: world CLIP)")
    dataset: str = option("", help="Karpathy-format dataset.json with long_captions.detail_units")
    images_root: str = option("", help="folder the dataset's image paths are relative to")
    split: str = option("val", help="the split to measure on")
    limit: int = option(0, help="at most this many images (0 = all)", at_least=0)
    scenes: str | None = option(None, help="offline world scenes.json: negatives must name an absent object")
    device: str = option("auto", help="auto (the GPU when present), cpu or cuda")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(SpecificityConfig, "python -m rewards.specificity", __doc__)
    cfg, _ = parse_config(SpecificityConfig, parser, argv)
    require_keys(cfg, ("weights", "dataset", "images_root"), "specificity")
    model = load_reward_model(RewardModelSpec(kind=cfg.kind, arch=cfg.arch, weights=cfg.weights),
                              pick_device(cfg.device))
    result = evaluate_specificity(model, cfg.dataset, cfg.images_root, cfg.split, cfg.limit,
                                  scenes=cfg.scenes)
    print(f"SR_pos {result['sr_pos']:.2f}  SR_neg {result['sr_neg']:.2f}  average {result['sr_avg']:.2f}  "
          f"({result['images']} images, {result['triplets']} triplets)")
    print(json.dumps({"model": cfg.weights, "split": cfg.split, **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
