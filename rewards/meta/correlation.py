"""Rank and linear correlation for metric meta-evaluation: Kendall τ_b and τ_c (with ties), Pearson r.

τ_b = (C − D) / sqrt((n₀ − n₁)(n₀ − n₂)),  τ_c = 2(C − D) / (n² (m − 1) / m),
with C, D the concordant and discordant pairs, n₀ = n(n−1)/2, n₁, n₂ the pairs tied in x and in y,
and m the smaller number of distinct values. Pairs are counted in row blocks, so memory stays
O(block × n) while the arithmetic is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BLOCK = 1024


def _concordance(x: np.ndarray, y: np.ndarray) -> int:
    """C − D over all pairs i < j."""
    total = 0
    for start in range(0, len(x), BLOCK):
        xs, ys = x[start: start + BLOCK, None], y[start: start + BLOCK, None]
        signs = np.sign(xs - x[None, :]) * np.sign(ys - y[None, :])
        total += int(signs.sum())
    return total // 2  # each pair counted twice, (i, j) and (j, i)


def _tied_pairs(values: np.ndarray) -> int:
    _, counts = np.unique(values, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())


def kendall_tau(x: Sequence[float], y: Sequence[float], variant: str = "b") -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-d sequences of one length, got {x.shape} and {y.shape}")
    n = len(x)
    if n < 2:
        return float("nan")
    s = _concordance(x, y)
    if variant == "b":
        n0 = n * (n - 1) // 2
        denominator = np.sqrt(float(n0 - _tied_pairs(x)) * float(n0 - _tied_pairs(y)))
        return float(s / denominator) if denominator > 0 else float("nan")
    if variant == "c":
        m = min(len(np.unique(x)), len(np.unique(y)))
        return float(2 * s / (n * n * (m - 1) / m)) if m > 1 else float("nan")
    raise ValueError(f"variant must be 'b' or 'c', got {variant!r}")


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")
