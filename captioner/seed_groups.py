"""Sweeps over seeds: the runs grouped by α, each α judged by its mean over the seeds.

A sweep with `seeds` names each run `alpha_<α>_seed_<s>`. Every run is read at its own best epoch by
the selection metric (a checkpoint within each seed, as for a single run); an α is then chosen by the
mean of those values over its seeds, shown with the 95% interval of that mean (plumbing.intervals).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from captioner.select import Selection, metric_mode
from plumbing.intervals import MeanInterval, mean_interval
from plumbing.tables import format_table, format_value

RUN_NAME = re.compile(r"^alpha_(?P<alpha>[^_]+)(?:_seed_(?P<seed>-?\d+))?$")


def run_name(alpha: float, seed: int | None = None) -> str:
    return f"alpha_{alpha:g}" if seed is None else f"alpha_{alpha:g}_seed_{seed}"


def parse_run_name(name: str) -> tuple[float, int | None] | None:
    """(α, seed) of a sweep's run folder name; None for a folder that is not one."""
    match = RUN_NAME.match(name)
    if match is None:
        return None
    try:
        alpha = float(match["alpha"])
    except ValueError:
        return None
    return alpha, None if match["seed"] is None else int(match["seed"])


@dataclass
class AlphaGroup:
    alpha: float
    runs: list[Selection] = field(default_factory=list)  # each seed's run at its best epoch, by seed
    seeds: list[int] = field(default_factory=list)

    def values(self, metric: str) -> list[float]:
        return [float(s.record[metric]) for s in self.runs if isinstance(s.record.get(metric), (int, float))]

    def interval(self, metric: str) -> MeanInterval | None:
        values = self.values(metric)
        return mean_interval(values) if values else None


def group_runs(runs: Sequence[tuple[float, int | None, Selection]]) -> list[AlphaGroup]:
    """Runs (α, seed, selection) into one group per α, in α order, each group's runs in seed order."""
    groups: dict[float, AlphaGroup] = {}
    for alpha, seed, selection in sorted(runs, key=lambda r: (r[0], -1 if r[1] is None else r[1])):
        group = groups.setdefault(alpha, AlphaGroup(alpha))
        group.runs.append(selection)
        group.seeds.append(seed)
    return list(groups.values())


def best_group(groups: Sequence[AlphaGroup], by: str, mode: str | None = None) -> AlphaGroup:
    """The α whose mean over its seeds of `by` is best (its own direction unless `mode`)."""
    scored = [g for g in groups if g.values(by)]
    pick = min if metric_mode(by, mode) == "min" else max
    return pick(scored, key=lambda g: g.interval(by).mean)


def best_seed(group: AlphaGroup, by: str, mode: str | None = None) -> Selection:
    pick = min if metric_mode(by, mode) == "min" else max
    return pick(group.runs, key=lambda s: s.record[by])


def format_groups(groups: Sequence[AlphaGroup], columns: Sequence[str], chosen: AlphaGroup | None,
                  start: dict | None = None, markdown: bool = False) -> str:
    """α against every metric: the mean over seeds and its 95% interval, below an optional start row."""
    rows = []
    if start is not None:
        rows.append(["start", "—"] + [format_value(start.get(c, "")) for c in columns])
    for group in groups:
        cells = [(group.interval(c).text() if group.values(c) else "") for c in columns]
        mark = " *" if group is chosen else ""
        rows.append([f"{group.alpha:g}{mark}", str(len(group.runs))] + cells)
    return format_table(["α", "seeds", *columns], rows, markdown=markdown)


def format_seed_runs(groups: Sequence[AlphaGroup], columns: Sequence[str], markdown: bool = False) -> str:
    """Every run of the sweep at its best epoch: one row per α and seed."""
    rows = [[f"{g.alpha:g}", str(seed), str(s.record["epoch"])] + [format_value(s.record.get(c)) for c in columns]
            for g in groups for seed, s in zip(g.seeds, g.runs, strict=True)]
    return format_table(["α", "seed", "epoch", *columns], rows, markdown=markdown)
