"""Two metrics judged on the same items: where each is right and the other is not, and whether that
difference is more than chance (an exact sign test on the discordant items, McNemar's exact test).

Accuracies a few items apart on a few hundred foils are often within what one draw of foils moves;
the paired test says so from the items themselves, without another draw.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from plumbing.errors import ConfigError


def sign_test(wins_a: int, wins_b: int) -> float:
    """Exact two-sided p-value of `wins_a` against `wins_b` under a fair coin (1.0 when both are 0):
    the probability of a split at least as uneven as this one, in either direction."""
    n, low = wins_a + wins_b, min(wins_a, wins_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2 ** n  # exact integers: no cancellation at large n
    return min(1.0, 2 * tail)


def compare_outcomes(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> dict[str, dict]:
    """Per group, and "all": the items whose outcome (1 right, 0.5 tie, 0 wrong) is higher under `a`
    ("a"), higher under `b` ("b"), and the sign test's p over those. The two lists are the same items
    in the same order, each (group, outcome)."""
    if [group for group, _ in a] != [group for group, _ in b]:
        raise ValueError("compare_outcomes: the two metrics were not judged on the same items")
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (group, won_a), (_, won_b) in zip(a, b, strict=True):
        if won_a != won_b:
            side = 0 if won_a > won_b else 1
            counts[group][side] += 1
            counts["all"][side] += 1
    groups = [*sorted({group for group, _ in a} - {"all"}), "all"]  # the pooled row last, under the kinds
    return {group: {"a": counts[group][0], "b": counts[group][1], "p": sign_test(*counts[group])}
            for group in groups}


def parse_pairs(spec: str, metrics: Sequence[str], skipped: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """'specs:clip_s,l_clip_s:clip_s' -> [(specs, clip_s), (l_clip_s, clip_s)]. Each name must be one of
    `metrics`; a `skipped` metric is named with its reason."""
    pairs = []
    for item in (part.strip() for part in spec.split(",")):
        names = [name.strip() for name in item.split(":")]
        if len(names) != 2 or not all(names) or names[0] == names[1]:
            raise ConfigError(f"compare: {item!r} is not two different metric names joined by ':' (e.g. specs:clip_s)")
        for name in names:
            if skipped and name in skipped:
                raise ConfigError(f"compare: {item!r}: {name} was skipped ({skipped[name]})")
            if name not in metrics:
                raise ConfigError(f"compare: {item!r}: {name!r} is not among the scored metrics "
                                f"({', '.join(metrics) or 'none'})")
        pairs.append((names[0], names[1]))
    return pairs


def compare_metrics(outcomes: dict[str, dict[str, list[tuple[str, float]]]], pairs: list[tuple[str, str]]
                    ) -> dict[str, dict[str, dict]]:
    """Per set (short, long, pairs) and pair "a:b": compare_outcomes of the two metrics' outcomes."""
    return {label: {f"{a}:{b}": compare_outcomes(metrics[a], metrics[b]) for a, b in pairs}
            for label, metrics in outcomes.items()}
