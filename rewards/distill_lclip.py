"""`python -m rewards.distill_lclip --config configs/reward_models/world_lclip.yaml`

Distil a CLIP teacher into the L-CLIP student (stage 1: L_D per tower; stage 2: + the similarity
regulator); prints val R@1 and matching accuracy of teacher and student per epoch and writes a
DistillCLIP-style checkpoint (`state_dict` with `student.` keys) that loads with kind `lclip`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from plumbing.cli import command, config_parser, parse_config
from rewards.recipes.distill import DistillConfig, distill_lclip


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(DistillConfig, "python -m rewards.distill_lclip", __doc__)
    cfg, _ = parse_config(DistillConfig, parser, argv)
    print(json.dumps(distill_lclip(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
