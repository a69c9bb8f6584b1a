"""Does a selection metric pick the checkpoint a person would pick? Per seed of a sweep, every epoch of
every α's run is a candidate; a selector picks the one its metric ranks best, and is judged on the
target metrics: how often its pick is also the target's best candidate, and how far it falls short of
that best (the regret, in the target's units, never negative)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from captioner.run_log import read_metrics
from captioner.seed_groups import AlphaGroup
from captioner.select import metric_mode
from plumbing.tables import format_table

SELECTORS = ("specs", "cider", "clip_s")
TARGETS = ("cider", "hallucination_mention", "object_recall")


@dataclass
class Regret:
    selector: str
    target: str
    hits: int      # seeds where the selector's pick is also the target's best candidate
    seeds: int
    mean: float    # mean over seeds of how far the pick falls short of the best, in the target's units
    worst: float


def candidates_by_seed(groups: Sequence[AlphaGroup]) -> dict[int, list[dict]]:
    """Every epoch record of every α's run, per seed, each tagged with its α."""
    out: dict[int, list[dict]] = {}
    for group in groups:
        for seed, selection in zip(group.seeds, group.runs, strict=True):
            for record in read_metrics(selection.run):
                out.setdefault(seed, []).append({**record, "alpha": group.alpha})
    return out


def _best(records: list[dict], metric: str) -> dict:
    pick = min if metric_mode(metric) == "min" else max
    return pick(records, key=lambda r: r[metric])


def selection_regret(groups: Sequence[AlphaGroup], selectors: Sequence[str] = SELECTORS,
                     targets: Sequence[str] = TARGETS) -> list[Regret]:
    """One row per selector and target over the seeds; metrics a run did not log are left out."""
    per_seed = candidates_by_seed(groups)
    rows = []
    for selector in selectors:
        for target in targets:
            shortfalls, hits = [], 0
            for records in per_seed.values():
                usable = [r for r in records if isinstance(r.get(selector), (int, float))
                          and isinstance(r.get(target), (int, float))]
                if not usable:
                    continue
                pick, best = _best(usable, selector), _best(usable, target)
                shortfalls.append(abs(best[target] - pick[target]))
                hits += pick[target] == best[target]
            if shortfalls:
                rows.append(Regret(selector, target, hits, len(shortfalls), sum(shortfalls) / len(shortfalls),
                                   max(shortfalls)))
    return rows


def format_regret(rows: Sequence[Regret]) -> str:
    body = [[r.selector, r.target, f"{r.hits}/{r.seeds}", f"{r.mean:.4f}", f"{r.worst:.4f}"] for r in rows]
    head = ("selection regret: per seed, every epoch of every α is a candidate; the selector picks one, and is "
            "judged on the target (picks its best: seeds where it did; regret: how far short, mean and worst "
            "over seeds):")
    return head + "\n" + format_table(["selector", "target", "picks its best", "mean regret", "worst regret"], body)
