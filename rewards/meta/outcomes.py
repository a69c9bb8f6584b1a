"""How a judged pair counts, and accuracy per group: shared by the meta-evaluation tasks and the
reward-model recipes' end-of-run foil tables, so that both read a tie and a kind alike."""

from __future__ import annotations

from collections import defaultdict


def win(better: float, worse: float) -> float:
    """1 when the item that should win scores higher, 0.5 for a tie, else 0."""
    return 1.0 if better > worse else 0.5 if better == worse else 0.0


def grouped_accuracy(outcomes: list[tuple[str, float]]) -> dict[str, float]:
    """Accuracy per group, "all" over every item and, with two groups or more, "mean" over the groups:
    when the groups differ in size, a gain on a large one can hide a loss on a small one in "all"."""
    groups: dict[str, list[float]] = defaultdict(list)
    for group, won in outcomes:
        groups[group].append(won)
    accuracy = {group: sum(v) / len(v) for group, v in groups.items()}
    named = [value for group, value in accuracy.items() if group != "all"]
    accuracy["all"] = sum(won for _, won in outcomes) / len(outcomes)
    if len(named) > 1 and "mean" not in accuracy:  # a kind of that name keeps its own value
        accuracy["mean"] = sum(named) / len(named)
    return dict(sorted(accuracy.items()))
