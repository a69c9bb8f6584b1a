"""`python -m rewards.meta_eval {foil,pairs,human,world-foils}`: which metric to trust.

Input formats (JSON lists; `references` may be omitted when --references gives them by image id):

  foil   {"image_id": 1, "caption": "...", "references": ["..."],
          "foils": [{"caption": "...", "kind": "shape"}, ...]}            (FOIL / OHD-Caps style)
         optional "long_caption" on the item and its foils: scored as a second, "long" set (an item
         or foil with only one of the two is scored in that set only; a note says how many items a
         set scores when it leaves some out)
  pairs  {"image_id": 1, "candidates": ["...", "..."], "references": ["..."],
          "preference": 0 or 1, "category": "HC"}                        (Pascal-50S style)
  human  {"image_id": 1, "candidate": "...", "references": ["..."],
          "ratings": [3, 4]}  or  "rating": 3.5                            (Flickr8k-Expert / Composite style)

foil: accuracy at scoring the correct caption above its foil, per foil kind; pairs: accuracy at
preferring the human choice, per category (both also "all", over every item, and "mean", the
unweighted mean of the kinds or categories); human: Kendall τ_b, τ_c and Pearson r against the
mean rating. A tie counts one half. Metrics come from the suite (--metrics, default all that are
available); CLIP-family metrics need `reward_models` in --config (e.g. configs/scoring_world.yaml, with image
embeddings for the ids).
Prints a table, writes JSON (--out) and a markdown section (--markdown), both atomically.
foil and pairs with --compare a:b[,c:d]: per kind, the items each metric of a pair judges better than
the other, and the exact sign test's p-value over them (JSON "comparisons"): whether a gap of a few
items is more than chance.
`text-foils` writes a foil file from any Karpathy dataset's captions by text edits alone (no scene graph:
COCO's too): each image's first reference with a noun, adjective or number replaced, two swapped, a relation
inverted or its trigrams shuffled, one foil per edit kind (rewards/text/edits.py).
`world-foils` writes the offline world's foil file from scenes.json: captions rendered from each
scene with four foil kinds (--source rendered), or each image's own references with every kind the
hard-negative builder makes (--source references: size, texture, binding, place, count and background
too, in the references' wording), or foils in frames the world never writes (--source reworded:
"the blue star has a red circle above it", "three shapes in total"; features/world/reworded.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from features.world.foils import reference_foils, world_foils
from features.world.reworded import reworded_foils
from features.world.scene import load_scenes
from plumbing.atomic import write_json, write_text
from plumbing.cli import add_config_flags, command, config_from_args
from plumbing.config import option, require_keys
from plumbing.errors import ConfigError, DataError
from plumbing.karpathy import load_dataset
from plumbing.references import load_references
from rewards.context import ScoringContext, ScoringSettings
from rewards.meta.paired import compare_metrics, parse_pairs
from rewards.meta.tasks import (
    accuracy_tables,
    comparison_markdown,
    foil_outcomes,
    human_correlation,
    load_entries,
    markdown,
    pair_outcomes,
)
from rewards.meta.text_foils import text_foils
from rewards.recipes.data import long_captions
from rewards.suite import MetricSuite, resolve_names
from rewards.text.edits import KINDS as TEXT_EDITS
from rewards.text.edits import TextEditor

OUTCOME_TASKS = {"foil": foil_outcomes, "pairs": pair_outcomes}  # judged item by item: comparable in pairs
TASKS = (*OUTCOME_TASKS, "human")


@dataclass
class MetaEvalConfig(ScoringSettings):
    data: str = option("", help="the JSON file of the task (formats above)")
    metrics: str = option("all", help="'all' (every available metric) or a comma list", comma_list=True)
    references: str | None = option(None, help="references by image id (Karpathy dataset.json, COCO annotations "
                                    "or refs.json) for entries without 'references'")
    out: str | None = option(None, help="write the results JSON here")
    markdown: str | None = option(None, help="write a markdown section here (for a report)")
    compare: str | None = option(
        None, help="foil and pairs: metric pairs compared item by item, e.g. 'specs:clip_s,l_clip_s:clip_s'. Per "
        "kind, the items each metric of a pair judges better than the other (right where the other is wrong or "
        "tied) and the exact two-sided sign test's p-value over those items (McNemar's exact test): whether an "
        "accuracy gap is more than these items' chance", comma_list=True)


@dataclass
class WorldFoilsConfig:
    scenes: str = option("", help="the world's scenes.json")
    dataset: str = option("", help="the world's dataset.json")
    split: str = option("test", help="the split whose images get foils")
    limit: int = option(0, help="at most this many images (0 = all)", at_least=0)
    seed: int = option(0, help="random seed of the foils")
    source: Literal["rendered", "references", "reworded"] = option(
        "rendered", help="rendered: captions rendered from the scene, foils of shape, color, added and relation; "
        "references: each image's first reference and long caption, one parser-checked foil per kind the "
        "hard-negative builder can make; reworded: short captions in frames the world's captions never use "
        "(the subject last or inside another phrase, colours as predicates, counts and backgrounds said "
        "otherwise), one foil per kind")
    out: str = option("", help="the foil file to write")


@dataclass
class TextFoilsConfig:
    dataset: str = option("", help="any Karpathy-format dataset.json (COCO's dataset_coco.json, the world's)")
    split: str = option("test", help="the split whose images get foils")
    limit: int = option(0, help="at most this many images (0 = all)", at_least=0)
    seed: int = option(0, help="random seed of the edits")
    edits: list[str] = option(factory=lambda: list(TEXT_EDITS), help="the text edits a foil may come from")
    out: str = option("", help="the foil file to write")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rewards.meta_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="task", required=True)
    for task in TASKS:
        add_config_flags(sub.add_parser(task, help=f"{task} meta-evaluation"), MetaEvalConfig)
    add_config_flags(sub.add_parser("world-foils", help="write the offline world's foil file"), WorldFoilsConfig)
    add_config_flags(sub.add_parser("text-foils", help="write a foil file from any dataset's captions by text edits"),
                     TextFoilsConfig)
    return parser


def write_world_foils(cfg: WorldFoilsConfig) -> dict:
    require_keys(cfg, ("scenes", "dataset", "out"), "world-foils")
    entries = [e for e in load_dataset(cfg.dataset) if e.split == cfg.split]
    if cfg.limit:
        entries = entries[: cfg.limit]
    scenes, ids = load_scenes(cfg.scenes), [e.image_id for e in entries]
    missing = [i for i in ids if i not in scenes]
    if missing:
        raise DataError(f"{cfg.scenes}: no scene for image id {missing[0]} of {cfg.dataset} "
                        f"({len(missing)} of the split's {len(ids)} images have none)")
    if cfg.source == "references" and (bare := [e.image_id for e in entries if not e.raw_captions]):
        raise DataError(f"{cfg.dataset}: image id {bare[0]} has no reference caption to build foils from")
    if cfg.source == "references":
        items = reference_foils(scenes, {e.image_id: (e.raw_captions, long_captions(e)) for e in entries}, ids,
                                cfg.seed)
    else:
        build = reworded_foils if cfg.source == "reworded" else world_foils
        items = build(scenes, {e.image_id: e.raw_captions for e in entries}, ids, cfg.seed)
    write_json(cfg.out, items, indent=1)
    return {"out": cfg.out, "items": len(items), "foils": sum(len(i["foils"]) for i in items)}


def write_text_foils(cfg: TextFoilsConfig) -> dict:
    require_keys(cfg, ("dataset", "out"), "text-foils")
    entries = [e for e in load_dataset(cfg.dataset) if e.split == cfg.split]
    if not entries:
        raise DataError(f"{cfg.dataset}: no image of split {cfg.split!r}")
    entries = entries[: cfg.limit] if cfg.limit else entries
    editor = TextEditor([e.raw_captions[0] for e in entries], cfg.edits)
    items = text_foils(entries, editor, cfg.seed)
    if not items:
        raise DataError(f"{cfg.dataset}: no edit of {', '.join(cfg.edits)} applies to any caption of split "
                        f"{cfg.split!r} (e.g. {entries[0].raw_captions[0]!r})")
    write_json(cfg.out, items, indent=1)
    print(editor.stats.summary(), file=sys.stderr)
    return {"out": cfg.out, "items": len(items), "foils": sum(len(i["foils"]) for i in items),
            "images_without_foil": len(entries) - len(items), "impossible": dict(editor.stats.impossible)}


def run_task(task: str, cfg: MetaEvalConfig) -> dict:
    require_keys(cfg, ("data",), task)
    if cfg.compare:  # a misspelt pair fails here, before any model loads
        if task not in OUTCOME_TASKS:
            raise ConfigError(f"compare: the {task} task has no per-item outcomes to compare (foil and pairs have)")
        parse_pairs(cfg.compare, resolve_names(cfg.metrics))
    entries = load_entries(cfg.data)  # read and checked before the metrics load their models
    references = load_references(cfg.references) if cfg.references else None
    comparisons: dict = {}
    with MetricSuite(cfg.metrics, ScoringContext.from_settings(cfg)) as suite:
        if task == "human":
            tables = {task: human_correlation(cfg.data, entries, suite, references)}
        else:
            outcomes = OUTCOME_TASKS[task](cfg.data, entries, suite, references)
            tables = accuracy_tables(outcomes)
            if cfg.compare:
                scored = sorted({name for metrics in outcomes.values() for name in metrics})
                comparisons = compare_metrics(outcomes, parse_pairs(cfg.compare, scored, dict(suite.skipped)))
        skipped = dict(suite.skipped)
    result = tables if task == "foil" else tables[task]
    text = "".join(markdown(f"{task}: {name}", table) for name, table in tables.items())
    text += "".join(comparison_markdown(f"{task}: {label}", pair, table)
                    for label, pairs in comparisons.items() for pair, table in pairs.items())
    print(text)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    if cfg.out:
        record = {"task": task, "data": cfg.data, "results": result, "skipped": skipped}
        write_json(cfg.out, {**record, "comparisons": comparisons} if comparisons else record, indent=2)
    if cfg.markdown:
        write_text(cfg.markdown, text)
    return result


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args.config_class, args)
    if args.task in ("world-foils", "text-foils"):
        print(json.dumps((write_world_foils if args.task == "world-foils" else write_text_foils)(cfg)))
        return 0
    print(json.dumps({"task": args.task, "results": run_task(args.task, cfg)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
