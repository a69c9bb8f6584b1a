"""Intervals over a few repeated runs (seeds), from scipy rather than by hand.

With three to five seeds a percentile bootstrap cannot reach past the smallest and largest run, so
its 95% interval is too narrow to mean 95%; Student's t interval over the seeds' values is the one
that does (the interval Henderson et al., "Deep Reinforcement Learning that Matters", report over
seeds). One value gives no interval: its ends are NaN, and tables show them as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MeanInterval:
    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 4) -> str:
        if math.isnan(self.low):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> MeanInterval:
    """The mean of `values` and its two-sided Student's t interval (scipy.stats.t.interval)."""
    import numpy as np
    from scipy import stats

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("mean_interval of no values")
    mean = float(data.mean())
    if data.size < 2:
        return MeanInterval(mean, math.nan, math.nan, 1)
    spread = float(stats.sem(data))
    if spread == 0.0:
        return MeanInterval(mean, mean, mean, int(data.size))
    low, high = stats.t.interval(confidence, data.size - 1, loc=mean, scale=spread)
    return MeanInterval(mean, float(low), float(high), int(data.size))
