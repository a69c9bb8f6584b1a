"""`captioner.select --sweep DIR` on a sweep over seeds: the α chosen by its mean over the seeds (each
seed's run at its own best epoch), the table of means and 95% intervals, every run, the selection
regret of SPECS, CIDEr and CLIP-S, and with --paired every α against the chosen one (or --against)."""

from __future__ import annotations

import json
from pathlib import Path

from captioner.seed_groups import (
    AlphaGroup,
    best_group,
    best_seed,
    format_groups,
    format_seed_runs,
    group_runs,
    parse_run_name,
)
from captioner.select import metric_columns, select_epoch, sweep_runs
from captioner.selection_regret import format_regret, selection_regret
from plumbing.errors import ConfigError, DataError


def seeded_groups(sweep: Path, by: str, mode: str | None) -> list[AlphaGroup]:
    runs = []
    for run in sweep_runs(sweep):
        parsed = parse_run_name(run.name)
        if parsed is None or parsed[1] is None:
            raise DataError(f"{run}: a sweep over seeds names its runs alpha_<α>_seed_<s>; move this folder out of "
                            f"{sweep}")
        runs.append((parsed[0], parsed[1], select_epoch(run, by, mode)))
    return group_runs(runs)


def report(sweep: Path, by: str, mode: str | None, paired: bool, against: float | None) -> int:
    groups = seeded_groups(sweep, by, mode)
    chosen = best_group(groups, by, mode)
    columns = metric_columns([s.record for g in groups for s in g.runs])
    print(f"each α: the mean over its seeds (each run at its best epoch by {by}) and the 95% interval of that mean; "
          f"* chosen by its mean {by}:")
    print(format_groups(groups, columns, chosen))
    print("\nevery run:")
    print(format_seed_runs(groups, columns))
    print("\n" + format_regret(selection_regret(groups)))
    differences = None
    if paired:
        from captioner import paired_seeds  # scores every run's captions: only when asked

        reference = chosen if against is None else _group(groups, against)
        others = [g for g in groups if g is not reference]
        rows = paired_seeds.compare_alphas(reference, others, _paired_metrics(by))
        print("\n" + paired_seeds.format_differences(rows))
        differences = paired_seeds.difference_records(rows)
    mean, top = chosen.interval(by), best_seed(chosen, by, mode)
    print(f"\nbest by {by}: α = {chosen.alpha:g}, mean {mean.text()} over seeds {chosen.seeds}; "
          "each seed's checkpoint:")
    for seed, selection in zip(chosen.seeds, chosen.runs, strict=True):
        ckpt = selection.checkpoint
        print(f"  seed {seed}: {selection.run} epoch {selection.record['epoch']} ({selection.record[by]:.4f})"
              + (f"; checkpoint {ckpt}" if ckpt else "; its checkpoint was pruned"))
    print(json.dumps({
        "sweep": str(sweep), "by": by, "alpha": chosen.alpha, "mean": mean.mean, "low": mean.low, "high": mean.high,
        "seeds": chosen.seeds, "run": str(top.run), "epoch": top.record["epoch"], "value": top.record[by],
        "checkpoint": str(top.checkpoint) if top.checkpoint else None,
        "runs": [{"seed": seed, "run": str(s.run), "epoch": s.record["epoch"], "value": s.record[by],
                  "checkpoint": str(s.checkpoint) if s.checkpoint else None}
                 for seed, s in zip(chosen.seeds, chosen.runs, strict=True)],
        **({"paired": differences} if differences is not None else {})}))
    return 0


def _group(groups: list[AlphaGroup], alpha: float) -> AlphaGroup:
    for group in groups:
        if abs(group.alpha - alpha) < 1e-9:
            return group
    raise ConfigError(f"--against {alpha:g}: the sweep has no α {alpha:g}; its α: "
                      f"{', '.join(f'{g.alpha:g}' for g in groups)}")


def _paired_metrics(by: str) -> list[str]:
    from captioner.paired_seeds import METRICS

    return list(dict.fromkeys([*METRICS, by]))
