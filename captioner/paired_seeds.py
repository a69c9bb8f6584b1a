"""Two α's of a sweep over seeds compared on the same val images, over all their seeds.

Every run's chosen epoch left its val captions; each is scored per image by one metric suite (built
from the reference α's first run's config, loaded once). Two views of the difference, compared α minus
reference α:

- per image, pooled over seeds: each image's value averaged over the α's seeds, the difference taken
  image by image (the images are the same in every run, so their difficulty cancels), a 95% bootstrap
  interval over the images (scipy.stats.bootstrap) and the exact sign test over the images judged apart.
  Averaging over seeds folds the training noise into each image's value, but the interval reflects
  the draw of images only;
- paired by seed: the difference of the two runs' means at each shared seed, with Student's t
  interval and t test over the seeds (scipy): the training noise, with as many degrees of freedom as
  seeds less one.

An α beats the reference on a metric when the difference lies on the metric's better side and its
interval excludes zero; the two views say whether that holds over images, over seeds, or both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from captioner.paired_runs import per_image
from captioner.report import load_run_config
from captioner.seed_groups import AlphaGroup
from captioner.select import metric_mode
from captioner.train_config import scoring_context
from plumbing.errors import DataError
from plumbing.intervals import mean_interval
from plumbing.tables import format_table
from rewards import MetricSuite, sign_test

METRICS = ("object_recall", "hallucination_mention", "cider", "specs")
RESAMPLES = 2000


@dataclass
class AlphaDifference:
    alpha: float
    reference: float
    metric: str
    higher_is_better: bool
    images: int
    seeds: int
    difference: float    # alpha minus reference: per-image means over seeds, averaged over the images
    image_low: float     # 95% bootstrap interval over the images
    image_high: float
    ahead: int           # images where alpha's seed-mean is better
    behind: int
    image_p: float       # exact sign test over those images
    seed_difference: float  # mean over shared seeds of (alpha run's mean − reference run's mean)
    seed_low: float      # Student's t 95% interval over the seeds (NaN with one seed)
    seed_high: float
    seed_p: float        # one-sample t test of the per-seed differences against 0 (NaN with one seed)


def seed_scores(group: AlphaGroup, suite: MetricSuite, references: dict[int, list[str]],
                metric: str) -> dict[int, dict[int, float]]:
    """{seed: {image id: value}} for every run of the group at its chosen epoch."""
    return {seed: per_image(selection, suite, references, metric)
            for seed, selection in zip(group.seeds, group.runs, strict=True)}


def compare_alphas(reference: AlphaGroup, others: Sequence[AlphaGroup], metrics: Sequence[str] = METRICS,
                   seed: int = 0) -> list[AlphaDifference]:
    context = scoring_context(load_run_config(reference.runs[0].run))
    out = []
    with MetricSuite(list(metrics), context) as suite:
        usable = [m for m in metrics if m not in suite.skipped]
        for metric in usable:
            base = seed_scores(reference, suite, context.references, metric)
            for group in others:
                out.append(_difference(group, reference, metric, seed_scores(group, suite, context.references,
                                                                              metric), base, seed))
    return out


def _difference(group: AlphaGroup, reference: AlphaGroup, metric: str, mine: dict[int, dict[int, float]],
                base: dict[int, dict[int, float]], seed: int) -> AlphaDifference:
    from scipy import stats

    ids = sorted(next(iter(base.values())))
    for scores in (*mine.values(), *base.values()):
        if sorted(scores) != ids:
            raise DataError(f"the runs of α {group.alpha:g} and α {reference.alpha:g} were scored on other val "
                            f"images ({metric}); the runs of one sweep share them")
    a = np.array([[scores[i] for i in ids] for scores in mine.values()]).mean(axis=0)
    b = np.array([[scores[i] for i in ids] for scores in base.values()]).mean(axis=0)
    per_image_difference = a - b
    higher = metric_mode(metric) == "max"
    better = per_image_difference if higher else -per_image_difference
    ahead, behind = int((better > 0).sum()), int((better < 0).sum())
    if np.ptp(per_image_difference) > 0:
        boot = stats.bootstrap((per_image_difference,), np.mean, confidence_level=0.95, n_resamples=RESAMPLES,
                               method="percentile", random_state=seed)
        low, high = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    else:
        low = high = float(per_image_difference[0])
    shared = sorted(set(mine) & set(base))
    by_seed = [float(np.mean(list(mine[s].values())) - np.mean(list(base[s].values()))) for s in shared]
    seeds = mean_interval(by_seed)
    seed_p = float(stats.ttest_1samp(by_seed, 0.0).pvalue) if len(by_seed) > 1 and np.ptp(by_seed) > 0 else float("nan")
    return AlphaDifference(group.alpha, reference.alpha, metric, higher, len(ids), len(shared),
                           float(per_image_difference.mean()), low, high, ahead, behind, sign_test(ahead, behind),
                           seeds.mean, seeds.low, seeds.high, seed_p)


def beats(d: AlphaDifference, view: str = "image") -> bool:
    """The difference is on the metric's better side with its interval clear of zero."""
    low, high = (d.image_low, d.image_high) if view == "image" else (d.seed_low, d.seed_high)
    return low > 0 if d.higher_is_better else high < 0


def format_differences(rows: Sequence[AlphaDifference]) -> str:
    body = []
    for d in rows:
        body.append([d.metric, f"{d.alpha:g}", f"{d.difference:+.4f}", f"[{d.image_low:+.4f}, {d.image_high:+.4f}]",
                     f"{d.ahead} / {d.behind}", f"{d.image_p:.3g}", f"{d.seed_difference:+.4f}",
                     f"[{d.seed_low:+.4f}, {d.seed_high:+.4f}]", f"{d.seed_p:.3g}",
                     ("images" if beats(d) else "") + (" + seeds" if beats(d, "seed") else "")])
    reference = rows[0].reference if rows else 0.0
    head = (f"each α against α = {reference:g} over {rows[0].seeds if rows else 0} seeds (difference: α minus "
            f"α = {reference:g}; per image: the values averaged over seeds, 95% bootstrap interval over the "
            "images, images better / worse and the exact sign test; by seed: the runs' means paired by seed, "
            "Student's t interval and t test; beats: the better side with the interval clear of zero):")
    return head + "\n" + format_table(
        ["metric", "α", "difference", "95% interval (images)", "images better / worse", "p", "by seed",
         "95% interval (seeds)", "p (seeds)", "beats"], body)


def difference_records(rows: Sequence[AlphaDifference]) -> list[dict]:
    return [asdict(d) for d in rows]
