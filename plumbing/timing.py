"""Timing helpers for the benchmark commands: repeat, report the median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def median_seconds(fn: Callable[[], T], repeats: int = 5) -> tuple[float, T]:
    """Run fn `repeats` times; return the median wall time and the last result."""
    times = []
    result = None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def comparison(ours_s: float, ref_s: float, **extra: float) -> dict:
    return {"ours_s": round(ours_s, 6), "ref_s": round(ref_s, 6), "ratio": round(ref_s / ours_s, 2), **extra}


# Real MS-COCO references with one model caption each, beside the repository (shared/data).
COCO_1K = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco_val_1k.json"
