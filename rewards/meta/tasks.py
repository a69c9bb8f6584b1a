"""Metric meta-evaluation tasks: foil accuracy, pairwise preference accuracy and correlation with
human ratings (formats: `python -m rewards.meta_eval --help`). A tie counts one half."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from plumbing.errors import DataError
from plumbing.karpathy import read_json
from plumbing.tables import format_table
from rewards.meta.correlation import kendall_tau, pearson
from rewards.meta.outcomes import grouped_accuracy, win
from rewards.suite import MetricSuite


def load_entries(path: str | Path) -> list[dict]:
    """A task file's entries: a non-empty JSON list of objects with integer image ids."""
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


FOIL_SETS = (("caption", "short"), ("long_caption", "long"))
FOIL_FIELDS = {field for field, _ in FOIL_SETS}


Outcomes = dict[str, list[tuple[str, float]]]  # per metric, each judged item's (kind or category, win)


def foil_outcomes(path, entries: list[dict], suite: MetricSuite, references=None) -> dict[str, Outcomes]:
    """Per set (short, long): each metric's outcome on every (caption, foil) pair. Each set scores the
    entries and foils that carry its field; an entry needs one of the two. A set that only some entries
    carry is scored on those, with a note of how many it scores."""
    checked = _checked_foils(path, entries, references)
    result = {}
    for field, label in FOIL_SETS:
        rows, pairs, scored = _foil_rows(path, checked, field)
        if not pairs:
            if any(field in e for e in entries):
                print(f"foil: {path}: entries have {field!r} but none of their foils does; no {label} set",
                      file=sys.stderr)
            continue
        if scored < len(entries):
            print(f"foil: {path}: the {label} set scores {scored} of {len(entries)} entries (the others lack "
                  f"{field!r} on the entry or on every foil)", file=sys.stderr)
        scores = suite.score_rows(*zip(*rows, strict=True))
        result[label] = {name: [(kind, win(values[a], values[b])) for a, b, kind in pairs]
                         for name, values in scores.items()}
    if not result:
        raise DataError(f"{path}: no foil shares a field ('caption' or 'long_caption') with its entry")
    return result


def _checked_foils(path, entries: list[dict], references) -> list[tuple[int, dict, list[str]]]:
    """(k, entry, references) of every entry, each checked once for both sets: an entry has a caption of
    some length, its references and a non-empty list of foils, each an object with a caption."""
    checked = []
    for k, entry in enumerate(entries):
        if not FOIL_FIELDS & set(entry):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs 'caption' (or 'long_caption')")
        refs = _refs(path, k, entry, references)
        foils = entry.get("foils")
        if not isinstance(foils, list) or not foils:
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs a non-empty 'foils' list")
        for j, foil in enumerate(foils):
            if not isinstance(foil, dict) or not FOIL_FIELDS & set(foil):
                raise DataError(f"{path}: entry {k}: foils[{j}] must be an object with 'caption' "
                                "(or 'long_caption')")
        checked.append((k, entry, refs))
    return checked


def _foil_rows(path, checked: list[tuple[int, dict, list[str]]], field: str
               ) -> tuple[list[tuple[int, str, list[str]]], list[tuple[int, int, str]], int]:
    """One set's scored rows (image id, text, references), its pairs (row of correct, row of foil, kind)
    and how many entries it scores."""
    rows: list[tuple[int, str, list[str]]] = []
    pairs: list[tuple[int, int, str]] = []
    scored = 0
    for k, entry, refs in checked:
        own = [(j, foil) for j, foil in enumerate(entry["foils"]) if field in foil]  # a foil of one length: its set
        if field not in entry or not own:
            continue
        scored += 1
        correct = len(rows)
        rows.append((entry["image_id"], _text(path, k, entry, field), refs))
        for j, foil in own:
            pairs.append((correct, len(rows), str(foil.get("kind", "foil"))))
            rows.append((entry["image_id"], _text(f"{path} foils[{j}]", k, foil, field), refs))
    return rows, pairs, scored


def pair_outcomes(path, entries: list[dict], suite: MetricSuite, references=None) -> dict[str, Outcomes]:
    """{"pairs": each metric's outcome on every candidate pair, by its category}."""
    rows, meta = [], []
    for k, entry in enumerate(entries):
        candidates, preference = entry.get("candidates"), entry.get("preference")
        if not (isinstance(candidates, list) and len(candidates) == 2 and all(isinstance(c, str) for c in candidates)):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): 'candidates' must be two strings")
        if preference not in (0, 1) or isinstance(preference, bool):  # true/false would not say which candidate
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): 'preference' must be 0 or 1 "
                            f"(the preferred candidate's index), got {preference!r}")
        refs = _refs(path, k, entry, references)
        rows += [(entry["image_id"], candidates[0], refs), (entry["image_id"], candidates[1], refs)]
        meta.append((preference, str(entry.get("category", "all"))))
    scores = suite.score_rows(*zip(*rows, strict=True))
    return {"pairs": {name: [(category, win(values[2 * i + p], values[2 * i + 1 - p]))
                             for i, (p, category) in enumerate(meta)] for name, values in scores.items()}}


def human_correlation(path, entries: list[dict], suite: MetricSuite, references=None) -> dict:
    """τ_b, τ_c and r of each metric against the mean rating; None (null, "n/a") where a correlation is
    undefined because the ratings, or the metric's values, are all equal."""
    rows, ratings = [], []
    for k, entry in enumerate(entries):
        values = entry.get("ratings", [entry["rating"]] if "rating" in entry else None)
        if not isinstance(values, list) or not values or not all(_is_rating(v) for v in values):
            raise DataError(f"{path}: entry {k} (image id {entry['image_id']}): needs 'ratings' (finite numbers) "
                            f"or 'rating', got {values!r}")
        rows.append((entry["image_id"], _text(path, k, entry, "candidate"), _refs(path, k, entry, references)))
        ratings.append(sum(values) / len(values))
    if len(rows) < 2:
        raise DataError(f"{path}: a correlation needs at least two rated captions, got {len(rows)}")
    if len(set(ratings)) == 1:
        print(f"note: {path}: every caption has the same mean rating; no correlation is defined", file=sys.stderr)
    scores = suite.score_rows(*zip(*rows, strict=True))
    return {name: {"tau_b": _defined(kendall_tau(values, ratings, "b")),
                   "tau_c": _defined(kendall_tau(values, ratings, "c")),
                   "pearson": _defined(pearson(values, ratings)), "items": len(values)}
            for name, values in scores.items()}


def _is_rating(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _defined(value: float) -> float | None:
    return None if math.isnan(value) else value


def accuracy_tables(outcomes: dict[str, Outcomes]) -> dict[str, dict]:
    """Per set, each metric's accuracy per kind (rewards.meta.outcomes.grouped_accuracy)."""
    return {label: {name: grouped_accuracy(judged) for name, judged in metrics.items()}
            for label, metrics in outcomes.items()}


def markdown(title: str, table: dict) -> str:
    columns = sorted({c for row in table.values() for c in row if c != "items"})
    rows = [[name, *("n/a" if row.get(c) is None else f"{row[c]:.3f}" for c in columns)] for name, row in table.items()]
    return f"### {title}\n\n" + format_table(["metric", *columns], rows, markdown=True) + "\n"


def comparison_markdown(title: str, pair: str, table: dict) -> str:
    """One compared pair's table: per kind, the items each metric judges better than the other does (right
    where the other is wrong, or tied), and the p-value."""
    a, b = pair.split(":")
    rows = [[group, str(row["a"]), str(row["b"]), f"{row['p']:.3g}"] for group, row in table.items()]
    headers = ["kind", f"items {a} ahead", f"items {b} ahead", "p (exact sign test)"]
    return f"### {title}: {a} against {b}\n\n" + format_table(headers, rows, markdown=True) + "\n"

