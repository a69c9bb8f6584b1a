"""`python -m rewards.score --predictions results.json [--references dataset.json] [--images DIR]`

Scores a COCO results file with the metric suite. Writes, atomically, {"corpus": {metric: value},
"per_item": {metric: {image_id: value}}, "skipped": {metric: reason}} and prints a table.

CLIP-family metrics need reward models: `reward_models` in --config (e.g. configs/scoring_world.yaml)
or `--reward-model KEY=SPEC`, with SPEC `open_clip:ARCH:WEIGHTS`, `longclip:WEIGHTS` or `lclip:WEIGHTS`
(KEY is clip, specs or lclip; WEIGHTS a file, or for open_clip a hub tag). With `--images DIR` the
images' embeddings are computed with each model that has no embeds file and cached under its
fingerprint (as jmhessel/clipscore does); predictions name their image by `file_name` or by the
number in the file name. Without --references only the reference-free metrics run; the others are
listed as skipped. `--save-per-instance FILE` writes every metric of every caption.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from features.clip_models.spec import RewardModelSpec
from features.embed_cache import cached_embeddings, default_cache_dir
from features.images import file_numbers, image_files
from plumbing.atomic import write_json
from plumbing.cli import command, config_parser, parse_config
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError, DataError
from plumbing.karpathy import read_json
from plumbing.references import load_predictions, load_references
from rewards.context import ScoringContext, ScoringSettings
from rewards.suite import MetricSuite, SuiteResult


@dataclass
class ScoreConfig(ScoringSettings):
    predictions: str = option("", help="COCO results file [{image_id, caption}] (file_name optional)")
    references: str | None = option(None, help="Karpathy dataset.json, COCO captions_*.json or prepro's refs.json "
                                    "(without: reference-free metrics only)")
    split: str | None = option(None, help="Karpathy files: use only this split's references (train/val/test)")
    metrics: str = option("all", help="'all' or a comma list of metric names", comma_list=True)
    images: list[str] = option(factory=list, help="the predictions' images: folders or files (embeddings computed "
                               "and cached per reward model)")
    reward_model: list[str] = option(factory=list, help="KEY=open_clip:ARCH:WEIGHTS, KEY=longclip:WEIGHTS or "
                                     "KEY=lclip:WEIGHTS (repeat the flag, or give a comma list)")
    embeds_cache: str | None = option(None, help="where on-the-fly image embeddings are cached "
                                      "(default: ~/.cache/rlcap/embeds)")
    out: str | None = option(None, help="scores JSON to write")
    save_per_instance: str | None = option(None, help="write {image_id: {metric: value}} for every caption here")
    require_all: bool = option(False, help="every image with references must have a prediction (else a warning)")


def parse_reward_model(text: str) -> tuple[str, RewardModelSpec]:
    """KEY=open_clip:ARCH:WEIGHTS | KEY=longclip:WEIGHTS | KEY=lclip:WEIGHTS."""
    key, _, spec = text.partition("=")
    kind, _, rest = spec.partition(":")
    if not key or not rest or kind not in ("open_clip", "longclip", "lclip"):
        raise ConfigError(f"--reward-model {text!r}: expected KEY=open_clip:ARCH:WEIGHTS, KEY=longclip:WEIGHTS "
                          "or KEY=lclip:WEIGHTS")
    if kind == "open_clip":
        arch, _, weights = rest.partition(":")
        if not weights:
            raise ConfigError(f"--reward-model {text!r}: open_clip needs ARCH:WEIGHTS (a file or a hub tag)")
        return key, RewardModelSpec(kind=kind, arch=arch, weights=weights)
    return key, RewardModelSpec(kind=kind, weights=rest)


def images_of(predictions_path: str, ids: list[int], sources: list[str]) -> dict[int, Path]:
    """Each prediction's image file: its `file_name` (within the image folders), else the file whose
    name carries its id."""
    files = image_files(sources)
    by_name = {f.name: f for f in files}
    named = {e["image_id"]: e["file_name"] for e in read_json(predictions_path)
             if isinstance(e, dict) and isinstance(e.get("file_name"), str)}
    by_id: dict[int, list[Path]] = {}
    for file, number in file_numbers(files).items():  # files without a number (a README) are not images of ids
        by_id.setdefault(number, []).append(file)
    twice = {i: by_id[i] for i in ids if i not in named and len(by_id.get(i, [])) > 1}
    if twice:
        i, same = next(iter(twice.items()))
        raise DataError(f"{predictions_path}: image id {i} matches {len(same)} files "
                        f"({', '.join(str(f) for f in same)}); give each prediction its `file_name`")
    found = {i: by_name.get(Path(named[i]).name) if i in named else by_id.get(i, [None])[0] for i in ids}
    missing = [i for i, f in found.items() if f is None]
    if missing:
        raise DataError(f"{predictions_path}: no image in {', '.join(sources)} for {len(missing)} prediction(s), "
                        f"e.g. image ids {missing[:5]} (give `file_name`, or name files by id)")
    return found


def reward_models(cfg: ScoreConfig, ids: list[int]) -> dict[str, RewardModelSpec]:
    """The configured and the --reward-model specs; with --images, missing embeds are computed."""
    models = dict(cfg.reward_models) | dict(parse_reward_model(t) for t in cfg.reward_model)
    if cfg.images:
        files = images_of(cfg.predictions, ids, cfg.images)
        cache = Path(cfg.embeds_cache) if cfg.embeds_cache else default_cache_dir()
        models = {key: spec if spec.embeds else replace(spec, embeds=str(cached_embeddings(spec, files, cache,
                                                                                           cfg.device)))
                  for key, spec in models.items()}
    return models


def per_instance(result: SuiteResult) -> dict[str, dict[str, float]]:
    ids = sorted({i for items in result.per_item.values() for i in items})
    return {str(i): {m: items[i] for m, items in result.per_item.items() if i in items} for i in ids}


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = config_parser(ScoreConfig, "python -m rewards.score", __doc__)
    cfg, _ = parse_config(ScoreConfig, parser, argv)
    require_keys(cfg, ("predictions",), "score")
    predictions = load_predictions(cfg.predictions)
    references = load_references(cfg.references, cfg.split) if cfg.references else {}
    if references:
        check_coverage(cfg, predictions, references)
    cfg.reward_models = reward_models(cfg, list(predictions))
    with MetricSuite(cfg.metrics, ScoringContext.from_settings(cfg, references), bool(references)) as suite:
        result = suite.score(predictions, references)
    print(result.table())
    if cfg.out:
        write_json(cfg.out, result.to_json())
        print(f"wrote {cfg.out}")
    if cfg.save_per_instance:
        write_json(cfg.save_per_instance, per_instance(result))
        print(f"wrote {cfg.save_per_instance}")
    return 0


def check_coverage(cfg: ScoreConfig, predictions: dict[int, str], references: dict[int, list[str]]) -> None:
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


if __name__ == "__main__":
    raise SystemExit(main())
