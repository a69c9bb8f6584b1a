"""Is the run a sweep selects better than the others, image by image, or only by its corpus mean?

Sweep points often end within a few thousandths of each other on the selection metric. Each run's
chosen epoch left its val captions in samples/epoch_<k>.json; scoring them all with the chosen run's
metric gives per-image values on the same images, and from their differences a 95% bootstrap interval
of the mean difference and an exact sign test over the images the two runs are judged apart on
(`captioner.select --sweep DIR --paired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from captioner.report import load_run_config, read_samples
from captioner.select import LOSSES, Selection, metric_mode
from captioner.train_config import scoring_context
from plumbing.errors import ConfigError, DataError
from plumbing.tables import format_table
from rewards import MetricSuite, sign_test

RESAMPLES = 2000  # bootstrap draws of the images; the interval's ends move by about 0.1 of a standard error


@dataclass
class PairedRun:
    run: str
    epoch: int
    images: int
    rescored: float       # the mean of its per-image values (the logged corpus value for mean-type metrics)
    chosen_rescored: float  # the same for the chosen run
    difference: float     # chosen minus this run, signed so that > 0 means the chosen run is better
    low: float            # 95% bootstrap interval of `difference`
    high: float
    chosen_ahead: int     # images the chosen run scores better on
    run_ahead: int
    p: float              # exact two-sided sign test over those images


def per_image(selection: Selection, suite: MetricSuite, references: dict[int, list[str]], by: str) -> dict[int, float]:
    """The run's val captions of its chosen epoch, scored by `by`."""
    result = suite.score(read_samples(selection.run, selection.record["epoch"]), references)
    if by not in result.per_item:
        raise DataError(f"{selection.run}: {by} could not be scored ({result.skipped.get(by, 'no per-image values')})")
    return result.per_item[by]


def paired_runs(chosen: Selection, others: Sequence[Selection], by: str, mode: str | None = None,
                seed: int = 0) -> list[PairedRun]:
    """Each other run against the chosen one on the same val images, all judged by one metric built from the
    chosen run's settings (its config's references, CIDEr df and reward models), loaded once."""
    if by in LOSSES:
        raise ConfigError(f"--paired compares per-image scores of a metric; {by} is a loss, logged per epoch only")
    sign = 1.0 if metric_mode(by, mode) == "max" else -1.0
    context = scoring_context(load_run_config(chosen.run))
    compared = []
    with MetricSuite([by], context) as suite:
        mine = per_image(chosen, suite, context.references, by)
        ids = sorted(mine)
        my_values = np.array([mine[i] for i in ids])
        for other in others:
            theirs = per_image(other, suite, context.references, by)
            if theirs.keys() != mine.keys():
                raise DataError(f"{other.run}: its samples of epoch {other.record['epoch']} cover other val images "
                                f"than {chosen.run}'s ({len(theirs.keys() ^ mine.keys())} differ); runs of one sweep "
                                "share them")
            their_values = np.array([theirs[i] for i in ids])
            difference = sign * (my_values - their_values)
            low, high = bootstrap_interval(difference, seed)
            ahead, behind = int((difference > 0).sum()), int((difference < 0).sum())
            compared.append(PairedRun(other.run.name, other.record["epoch"], len(ids), float(their_values.mean()),
                                      float(my_values.mean()), float(difference.mean()), low, high, ahead, behind,
                                      sign_test(ahead, behind)))
    return compared


def bootstrap_interval(values: np.ndarray, seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 2.5% and 97.5% quantiles of the mean over `resamples` draws of the values with replacement."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def format_paired(chosen: Selection, compared: Sequence[PairedRun], by: str) -> str:
    rows = [[p.run, str(p.epoch), str(p.images), f"{p.rescored:.4f}", f"{p.difference:+.4f}",
             f"[{p.low:+.4f}, {p.high:+.4f}]", str(p.chosen_ahead), str(p.run_ahead), f"{p.p:.3g}"] for p in compared]
    mean = f"; its {by} rescored {compared[0].chosen_rescored:.4f}" if compared else ""
    head = (f"{chosen.run.name} (epoch {chosen.record['epoch']}{mean}) against each run, {by} per val image "
            f"(difference > 0: {chosen.run.name} better; 95% bootstrap interval; exact sign test over the images "
            "judged apart):")
    return head + "\n" + format_table(["run", "epoch", "images", f"its {by}", "difference", "95% interval",
                                       f"{chosen.run.name} ahead", "run ahead", "p"], rows)


def paired_records(compared: Sequence[PairedRun]) -> list[dict]:
    return [asdict(p) for p in compared]
