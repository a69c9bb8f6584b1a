"""`python -m rewards.train_grammar --arch ARCH --weights CLIP --dataset dataset.json --out grammar.safetensors`

Trains the grammar head (CLIP-Caption-Reward's grammar reward) on a CLIP's frozen text embeddings: the train
split's captions against copies with a word repeated, removed or inserted, two neighbours swapped or the
words shuffled. Prints and writes (beside --out, .json) the held-out accuracy on the val split, overall and
per corruption. Name the head as `reward_models.clip.grammar` to use the `grammar` reward and metric.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from plumbing.cli import command, config_parser, parse_config
from rewards.recipes.grammar import GrammarConfig, train_grammar


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(GrammarConfig, "python -m rewards.train_grammar", __doc__)
    cfg, _ = parse_config(GrammarConfig, parser, argv)
    summary = train_grammar(cfg)
    print(json.dumps({k: summary[k] for k in ("out", "train_captions", "val")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
