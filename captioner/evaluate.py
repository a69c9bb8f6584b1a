"""`python -m captioner.evaluate --checkpoint DIR --split test [--beam 3] [--block-trigrams] --out results.json`

Decodes a split with a checkpoint's weights, writes COCO-format results (atomically), scores
them with the metric suite and writes the scores next to the results. The data and reward models
are the run's (its saved config); `--set data.feats=other.h5` and the like point it elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from captioner.decoding import DecodeConfig
from captioner.inference import decode_for_config, load_captioner, score_captions
from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys


@dataclass
class DataPaths:
    """The run's data paths, replaced where given (None keeps the run's)."""

    labels: str | None = None
    vocab: str | None = None
    refs: str | None = None
    feats: str | None = None
    cider_df: str | None = None
    scenes: str | None = None


@dataclass
class EvaluateConfig:
    checkpoint: str = option("", help="a checkpoint directory, e.g. runs/x/checkpoints/best")
    split: str = option("test", help="the split to decode")
    decode: DecodeConfig = option(factory=DecodeConfig, help="decoding options", flatten=True)
    out: str = option("", help="results JSON (COCO results format); scores go beside it (.scores.json)")
    metrics: str | None = option(None, help="comma list (default: the run's eval.metrics)", comma_list=True)
    data: DataPaths = option(factory=DataPaths, help="the run's data paths to replace (--set data.feats=...)")

    def run_overrides(self) -> list[str]:
        return [f"data.{f.name}={getattr(self.data, f.name)}" for f in fields(self.data)
                if getattr(self.data, f.name) is not None]


def results_entries(captions: dict[int, list[str]]) -> list[dict]:
    """COCO results: one entry per caption (sample_n gives an image several, in sampling order)."""
    return [{"image_id": image_id, "caption": text} for image_id, texts in sorted(captions.items()) for text in texts]


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(EvaluateConfig, "python -m captioner.evaluate", __doc__)
    cfg, _ = parse_config(EvaluateConfig, parser, argv)
    require_keys(cfg, ("checkpoint", "out"), "evaluate")
    model, run_cfg, vocab = load_captioner(cfg.checkpoint, cfg.run_overrides())
    decoded = decode_for_config(model, vocab, run_cfg, cfg.split, cfg.decode, where=cfg.checkpoint)
    write_json(cfg.out, results_entries(decoded))
    captions = {image_id: texts[0] for image_id, texts in decoded.items()}  # sample_n: the first is scored
    result = score_captions(captions, run_cfg, cfg.metrics or run_cfg.eval.metrics)
    scores_path = Path(cfg.out).with_suffix(".scores.json")
    write_json(scores_path, result.to_json())
    print(result.table())
    print(f"wrote {cfg.out} and {scores_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
