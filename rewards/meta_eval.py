"""`python -m rewards.meta_eval {foil,pairs,human,world-foils}`: which metric to trust.

Input formats (JSON lists; `references` may be omitted when --references gives them by image id):

  foil   {"image_id": 1, "caption": "...", "references": ["..."],
          "foils": [{"caption": "...", "kind": "shape"}, ...]}            (FOIL / OHD-Caps style)
         optional "long_caption" on the item and its foils: scored as a second, "long" set
  pairs  {"image_id": 1, "candidates": ["...", "..."], "references": ["..."],
          "preference": 0 or 1, "category": "HC"}                        (Pascal-50S style)
  human  {"image_id": 1, "candidate": "...", "references": ["..."],
          "ratings": [3, 4]}  or  "rating": 3.5                            (Flickr8k-Expert / Composite style)

foil: accuracy at scoring the correct caption above its foil, per foil kind; pairs: accuracy at
preferring the human choice, per category; human: Kendall τ_b, τ_c and Pearson r against the
mean rating. A tie counts one half. Metrics come from the suite (--metrics, default all that are
available); CLIP-family metrics need `reward_models` in --config (image embeddings for the ids).
Prints a table, writes JSON (--out) and a markdown section (--markdown), both atomically.
`world-foils` writes the offline world's foil file from scenes.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from captioner.atomic import write_json, write_text
from captioner.cli import command
from captioner.config import load_config
from captioner.errors import DataError
from captioner.karpathy import read_json
from captioner.train_config import TrainConfig, metric_context
from rewards.correlation import kendall_tau, pearson
from rewards.suite import MetricSuite


def _entries(path: str | Path) -> list[dict]:
    data = read_json(path)
    if not isinstance(data, list) or not data:
        raise DataError(f"{path}: expected a non-empty JSON list of entries")
    for k, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("image_id"), int):
            raise DataError(f"{path}: entry {k} needs an integer 'image_id'")
    return data


def _text(path, k: int, entry: dict, key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise DataError(f"{path}: entry {k} (image id {entry.get('image_id')}): {key!r} must be a string")
    return value


def _refs(path, k: int, entry: dict, references: dict[int, list[str]] | None) -> list[str]:
    refs = entry.get("references")
    if refs is None and references is not None:
        refs = references.get(entry["image_id"])
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs 'references' (a non-empty list "
                        "of strings) or --references covering this id")
    return refs


def _win(better: float, worse: float) -> float:
    return 1.0 if better > worse else 0.5 if better == worse else 0.0


def foil_accuracy(path, suite: MetricSuite, references=None) -> dict:
    entries = _entries(path)
    result = {}
    for field, label in (("caption", "short"), ("long_caption", "long")):
        if field == "long_caption" and not all("long_caption" in e for e in entries):
            continue
        rows: list[tuple[int, str, list[str]]] = []
        pairs: list[tuple[int, int, str]] = []  # (row of correct, row of foil, kind)
        for k, entry in enumerate(entries):
            refs = _refs(path, k, entry, references)
            foils = entry.get("foils")
            if not isinstance(foils, list) or not foils:
                raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs a non-empty 'foils' list")
            correct = len(rows)
            rows.append((entry["image_id"], _text(path, k, entry, field), refs))
            for j, foil in enumerate(foils):
                if not isinstance(foil, dict):
                    raise DataError(f"{path}: entry {k}: foils[{j}] must be an object with 'caption'")
                pairs.append((correct, len(rows), str(foil.get("kind", "foil"))))
                rows.append((entry["image_id"], _text(f"{path} foils[{j}]", k, foil, field), refs))
        scores = suite.score_rows(*zip(*rows, strict=True))
        result[label] = _grouped({name: [(kind, _win(values[a], values[b])) for a, b, kind in pairs]
                                  for name, values in scores.items()})
    return result


def pair_accuracy(path, suite: MetricSuite, references=None) -> dict:
    entries = _entries(path)
    rows, meta = [], []
    for k, entry in enumerate(entries):
        candidates, preference = entry.get("candidates"), entry.get("preference")
        if not (isinstance(candidates, list) and len(candidates) == 2 and all(isinstance(c, str) for c in candidates)):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): 'candidates' must be two strings")
        if preference not in (0, 1):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): 'preference' must be 0 or 1")
        refs = _refs(path, k, entry, references)
        rows += [(entry["image_id"], candidates[0], refs), (entry["image_id"], candidates[1], refs)]
        meta.append((preference, str(entry.get("category", "all"))))
    scores = suite.score_rows(*zip(*rows, strict=True))
    return _grouped({name: [(category, _win(values[2 * i + p], values[2 * i + 1 - p]))
                            for i, (p, category) in enumerate(meta)] for name, values in scores.items()})


def human_correlation(path, suite: MetricSuite, references=None) -> dict:
    entries = _entries(path)
    rows, ratings = [], []
    for k, entry in enumerate(entries):
        values = entry.get("ratings", [entry["rating"]] if "rating" in entry else None)
        if not isinstance(values, list) or not values or not all(isinstance(v, (int, float)) for v in values):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs 'ratings' (numbers) or 'rating'")
        rows.append((entry["image_id"], _text(path, k, entry, "candidate"), _refs(path, k, entry, references)))
        ratings.append(sum(values) / len(values))
    scores = suite.score_rows(*zip(*rows, strict=True))
    return {name: {"tau_b": kendall_tau(values, ratings, "b"), "tau_c": kendall_tau(values, ratings, "c"),
                   "pearson": pearson(values, ratings), "items": len(values)} for name, values in scores.items()}


def _grouped(outcomes: dict[str, list[tuple[str, float]]]) -> dict:
    table = {}
    for name, pairs in outcomes.items():
        groups: dict[str, list[float]] = defaultdict(list)
        for group, win in pairs:
            groups[group].append(win)
            if group != "all":
                groups["all"].append(win)
        table[name] = {group: sum(v) / len(v) for group, v in sorted(groups.items())}
    return table


def markdown(title: str, table: dict) -> str:
    columns = sorted({c for row in table.values() for c in row if c != "items"})
    lines = [f"### {title}", "", "| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{row.get(c, float('nan')):.3f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _suite(args: argparse.Namespace) -> MetricSuite:
    cfg = load_config(TrainConfig, args.config, args.overrides)
    return MetricSuite(args.metrics or "all", metric_context(cfg, args.device))


def _references(path: str | None) -> dict[int, list[str]] | None:
    if not path:
        return None
    from rewards.references import load_references

    return load_references(path)


def _world_foils(args: argparse.Namespace) -> int:
    from captioner.karpathy import load_dataset
    from rewards.diagnostics import load_scenes
    from rewards.world_foils import world_foils

    entries = [e for e in load_dataset(args.dataset) if e.split == args.split]
    if args.limit:
        entries = entries[: args.limit]
    items = world_foils(load_scenes(args.scenes), {e.image_id: e.raw_captions for e in entries},
                        [e.image_id for e in entries], args.seed)
    write_json(args.out, items, indent=1)
    print(json.dumps({"out": args.out, "items": len(items), "foils": sum(len(i["foils"]) for i in items)}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rewards.meta_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="task", required=True)
    for task in ("foil", "pairs", "human"):
        p = sub.add_parser(task, help=f"{task} meta-evaluation")
        p.add_argument("--data", required=True, help="the JSON file (format above)")
        p.add_argument("--metrics", help="comma list (default: every available metric)")
        p.add_argument("--references", help="references by image id (Karpathy dataset.json, COCO annotations or "
                       "refs.json) for entries without 'references'")
        p.add_argument("--config", help="a training YAML whose reward_models / data.cider_df the metrics use")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--device", default="auto")
        p.add_argument("--out", help="write the results JSON here")
        p.add_argument("--markdown", help="write a markdown section here (for the run report)")
    world = sub.add_parser("world-foils", help="write the offline world's foil file")
    world.add_argument("--scenes", required=True)
    world.add_argument("--dataset", required=True)
    world.add_argument("--split", default="test")
    world.add_argument("--limit", type=int, default=0)
    world.add_argument("--seed", type=int, default=0)
    world.add_argument("--out", required=True)
    return parser


TASKS = {"foil": foil_accuracy, "pairs": pair_accuracy, "human": human_correlation}


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.task == "world-foils":
        return _world_foils(args)
    with _suite(args) as suite:
        result = TASKS[args.task](args.data, suite, _references(args.references))
        skipped = dict(suite.skipped)
    tables = result if args.task == "foil" else {args.task: result}
    text = "".join(markdown(f"{args.task}: {name}", table) for name, table in tables.items())
    print(text)
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    if args.out:
        write_json(args.out, {"task": args.task, "data": args.data, "results": result, "skipped": skipped}, indent=2)
    if args.markdown:
        write_text(args.markdown, text)
    print(json.dumps({"task": args.task, "results": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
