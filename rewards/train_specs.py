"""`python -m rewards.train_specs --config configs/reward_models/world_specs.yaml`

SPECS specificity fine-tuning (alpha*contrastive + beta*L_pos + gamma*L_neg with a detached
dynamic margin) of a CLIP stretched to 248 text positions by the LongCLIP rule; writes a
SPECS-layout spec.pt that loads with reward-model kind `longclip`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from plumbing.cli import command, config_parser, parse_config
from rewards.recipes.specs import TrainSpecsConfig, train_specs


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(TrainSpecsConfig, "python -m rewards.train_specs", __doc__)
    cfg, _ = parse_config(TrainSpecsConfig, parser, argv)
    print(json.dumps(train_specs(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
