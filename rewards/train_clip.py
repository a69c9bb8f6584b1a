"""`python -m rewards.train_clip --config configs/reward_models/world_clip.yaml`

Train a CLIP (any open_clip architecture) contrastively on a Karpathy-format dataset's images and
captions, optionally with hard text negatives (`negatives: world`) and then a text stage that
teaches the text tower spatial relations against the frozen image tower (`text_*_epochs`; with
`epochs: 0` alone on `init`'s weights); prints val R@1 (image->text,
text->image) against chance each epoch, writes an open_clip state dict (.safetensors) and, on the
offline world, ends with its world-foil accuracy per kind. Streams the images; runs on one or
many processes (`accelerate launch -m rewards.train_clip ...`); an interrupted run resumes from
its last finished epoch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from plumbing.cli import command, config_parser, parse_config
from rewards.recipes.clip import TrainClipConfig, train_clip


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(TrainClipConfig, "python -m rewards.train_clip", __doc__)
    cfg, _ = parse_config(TrainClipConfig, parser, argv)
    print(json.dumps(train_clip(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
